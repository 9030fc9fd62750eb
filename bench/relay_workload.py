"""The relay workload: deliveries to twenty partners, while one is dead and one rate-limits.

An outbox's real trouble is not a slow partner but a few bad ones among many
good ones: a dead partner whose deliveries each hold a worker until their
timeout, and a rate-limited one that answers 429 when called too often. This
measures what they cost the healthy partners, in three scenarios:

- ``healthy``: every target answers 200 in 50 ms;
- ``outage``: one target dead (the client gives up after 2 s, an ordinary
  failure, retried with backoff), one limited to 20 requests/s (429 with
  ``Retry-After: 1``, a snooze), no limit in the queue;
- ``outage, per_target 4``: the same, with at most 4 jobs of one target
  running at once (django-intents: ``INTENTS["LIMITS"]``; Procrastinate: a
  ``lock`` per target and slot, ``f"{target}:{n % 4}"``);
- ``healthy, per_target 64`` (django-intents only): no outage and a limit
  that never binds, to tell the cost of the limited claim from the outage's.

The jobs are enqueued at once, spread evenly and interleaved over the
targets; one worker process delivers them with the same number in flight for
every system. The healthy targets are targets 2 to 19 in every scenario, the
all-healthy one included, so that the outages are compared with what the same
partners got without them (the issue's own table counts them so). A run ends
when every healthy target has had all its deliveries (counted by the partner,
``bench/relay_server.py``), or at the time limit; the worker is then stopped
with SIGTERM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .io_workload import ConnectionSampler, _free_port, _last_log_line, _reap
from .systems import MANAGE, POLL

if TYPE_CHECKING:
    from .suite import Suite

KIND = "bench.relay"
DEAD, LIMITED = 0, 1  # the misbehaving targets' numbers in the outage scenarios
# The partners that stay healthy in every scenario: the ones whose rate is compared.
HEALTHY = [t for t in range(20) if t not in (DEAD, LIMITED)]
# The last one is a diagnosis, django-intents only: a limit too wide to bind,
# so its difference from "healthy" is the cost of the limited claim itself.
SCENARIOS = ["healthy", "outage", "outage, per_target 4", "healthy, per_target 64"]


class RelaySystem:
    """The relay adapter of one system; ``scenarios`` are the ones it can express."""

    scenarios: tuple[str, ...] = ()

    def fill(self, targets: list[str], n: int, per_target: int | None) -> None:
        raise NotImplementedError

    def workers(self, in_flight: int, sizes: dict[str, Any]) -> tuple[list[list[str]], str]:
        """The worker processes' command lines, and their setting as the table shows it."""
        raise NotImplementedError

    def env(self, per_target: int | None) -> dict[str, str]:
        return {}

    def lost(self, target: str) -> int:
        """Jobs of ``target`` that lost an attempt to a 429 (see docs/benchmarks.md)."""
        raise NotImplementedError

    def snoozes(self, target: str) -> int | None:
        """How often ``target``'s jobs snoozed, where the system counts it."""
        return None


def _jobs(targets: list[str], n: int) -> Iterator[tuple[int, str, str]]:
    """Job ``i`` goes to target ``i % 20``, so every claim window sees them all.

    Yields the job's number among its target's jobs, the target and the key.
    """
    for i in range(n):
        yield i // len(targets), targets[i % len(targets)], f"relay-{i}"


class Intents(RelaySystem):
    scenarios = tuple(SCENARIOS)

    def fill(self, targets: list[str], n: int, per_target: int | None) -> None:
        from django_intents.models import Intent

        jobs = list(_jobs(targets, n))
        for start in range(0, n, 500):
            at = time.time()
            Intent.objects.enqueue_many(
                [
                    {"kind": KIND, "event_id": key, "target": target, "payload": {"at": at}}
                    for _, target, key in jobs[start : start + 500]
                ]
            )

    def workers(self, in_flight: int, sizes: dict[str, Any]) -> tuple[list[list[str]], str]:
        argv = [*MANAGE, "run_intent_workers", "--kinds", KIND, "--concurrency", str(in_flight)]
        return [[*argv, "-v", "0"]], f"--concurrency {in_flight}"

    def env(self, per_target: int | None) -> dict[str, str]:
        if per_target is None:
            return {}
        return {"BENCH_LIMITS": json.dumps({KIND: {"per_target": per_target}})}

    def lost(self, target: str) -> int:
        from django.db.models import F, Q

        from django_intents.models import Intent

        # Every counted attempt (attempts - snoozes) but the one that
        # delivered was lost: this partner fails nothing but with 429s.
        # Read while the worker still runs: a stop releases the claims whose
        # handlers still run with their attempt counted, which no 429 caused.
        done = Intent.objects.filter(kind=KIND, target=target).exclude(state="running")
        return done.filter(
            Q(state="completed", attempts__gt=F("snoozes") + 1)
            | (~Q(state="completed") & Q(attempts__gt=F("snoozes")))
        ).count()

    def snoozes(self, target: str) -> int | None:
        from django.db.models import Sum

        from django_intents.models import Intent

        found = Intent.objects.filter(kind=KIND, target=target).aggregate(n=Sum("snoozes"))
        return found["n"] or 0


class Procrastinate(RelaySystem):
    """An ``async def`` task, ``--concurrency``, and a ``lock`` per target slot for the limit."""

    scenarios = tuple(SCENARIOS[:3])

    def fill(self, targets: list[str], n: int, per_target: int | None) -> None:
        from procrastinate.contrib.django import app

        from .benchapp import tasks

        jobs = list(_jobs(targets, n))
        for start in range(0, n, 500):
            at = time.time()
            batch = [
                tasks.relay.configure(
                    lock=f"{target}:{i % per_target}" if per_target else None
                ).make_new_job(target=target, key=key, at=at)
                for i, target, key in jobs[start : start + 500]
            ]
            app.job_manager.batch_defer_jobs(batch)

    def workers(self, in_flight: int, sizes: dict[str, Any]) -> tuple[list[list[str]], str]:
        # Retries come due without a notification: poll as often as we do.
        argv = [*MANAGE, "procrastinate", "worker", "--concurrency", str(in_flight), "--wait"]
        return [[*argv, "--fetch-job-polling-interval", POLL]], f"--concurrency {in_flight}"

    def lost(self, target: str) -> int:
        from django.db import connection

        # Its ``attempts`` counts snoozes too; what a 429 can cost here is
        # the job itself, failed for good by the retry strategy.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed' "
                "AND args->>'target' = %s",
                [target],
            )
            return int(cursor.fetchone()[0])


class TasksDB(RelaySystem):
    """``db_worker`` processes, one job each at a time; no limit, so the outage only.

    Django's task framework has no retry: a 429 enqueues the delivery again
    with ``run_after`` (``benchapp/djtasks.py``), and a failure is final.
    """

    scenarios = ("outage",)

    def fill(self, targets: list[str], n: int, per_target: int | None) -> None:
        from django.db import transaction

        from .benchapp import djtasks

        jobs = list(_jobs(targets, n))
        for start in range(0, n, 500):
            at = time.time()
            with transaction.atomic():
                for _, target, key in jobs[start : start + 500]:
                    djtasks.relay.enqueue(target=target, key=key, at=at)

    def workers(self, in_flight: int, sizes: dict[str, Any]) -> tuple[list[list[str]], str]:
        count = sizes["relay_tasks_db_processes"]
        argv = [*MANAGE, "db_worker", "--interval", POLL, "--no-startup-delay", "--no-reload"]
        return [[*argv, "-v", "0"]] * count, f"{count} × db_worker"

    def lost(self, target: str) -> int:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.filter(
            status="FAILED", args_kwargs__kwargs__target=target
        ).count()


RELAY_SYSTEMS: dict[str, type[RelaySystem]] = {
    "intents": Intents,
    "procrastinate": Procrastinate,
    "tasks_db": TasksDB,
}


@contextmanager
def partner(suite: Suite, outage: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """Run ``bench/relay_server.py``; yield its URL and a dict that gets its CPU at the end."""
    port = _free_port()
    argv = [sys.executable, "-m", "bench.relay_server", "--port", str(port)]
    if outage:
        argv += ["--dead", str(DEAD), "--limited", str(LIMITED)]
    proc = subprocess.Popen(argv, cwd=suite.work, env=suite.env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError("bench/relay_server.py did not start")
    out: dict[str, Any] = {}
    try:
        yield f"http://127.0.0.1:{port}", out
    finally:
        proc.terminate()
        usages, _ = _reap([proc], 15)
        proc.stdout.close()
        out["cpu"] = sum(u.ru_utime + u.ru_stime for u in usages)


def _stats(url: str, latencies: bool = False) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats{'?latencies=1' if latencies else ''}") as r:  # noqa: S310 - our own local server
        stats: dict[str, Any] = json.loads(r.read())
    return stats


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(len(ordered) * q) - 1)] if ordered else None


def run_scenario(
    suite: Suite, relay: RelaySystem, scenario: str, sizes: dict[str, Any]
) -> dict[str, Any]:
    """Fill, start the worker, wait for the healthy targets, stop it, read the partner's counts."""
    from django.db import connection

    n = sizes.get(f"relay_{suite.system.name}", sizes["relay"])
    in_flight = sizes["relay_in_flight"]
    outage = scenario.startswith("outage")
    per_target = int(scenario.rpartition(" ")[2]) if "per_target" in scenario else None
    suite.reset()
    argvs, setting = relay.workers(in_flight, sizes)
    row: dict[str, Any] = {"scenario": scenario, "setting": setting, "n": n}
    row["processes"] = len(argvs)
    env = {**suite.env, "BENCH_RELAY_POOL": str(in_flight), **relay.env(per_target)}
    with partner(suite, outage) as (url, server):
        targets = [f"{url}/t/{t}" for t in range(20)]
        relay.fill(targets, n, per_target)
        # The same 18 targets in every scenario, as the table counts them: in
        # the all-healthy run targets 0 and 1 get a tenth of the slots, and the
        # outage may not take more than that from the others.
        healthy = HEALTHY
        expected = sum(1 for i in range(n) if i % 20 in healthy)
        row["load"] = os.getloadavg()[0]
        connection.close()  # the sampler counts the worker's connections only
        sampler = ConnectionSampler(suite.vendor, connection.settings_dict["NAME"])
        sampler.start()
        with suite.log.open("ab") as log:
            procs = [
                subprocess.Popen(
                    argv, cwd=suite.work, env=env, stdout=log, stderr=subprocess.STDOUT
                )
                for argv in argvs
            ]
        deadline = time.monotonic() + sizes["relay_timeout"]
        delivered = 0
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            counts = _stats(url)["targets"]
            delivered = sum(counts[t]["delivered"] for t in healthy)
            if delivered >= expected:
                break
            time.sleep(0.2)
        if delivered < expected:
            row["timed_out"] = sizes["relay_timeout"]
        # Sampled until the healthy targets are done: the read below is ours.
        row["peak_connections"] = sampler.stop()
        if outage:
            connection.ensure_connection()
            row["limited_lost"] = relay.lost(targets[LIMITED])
            # Each snooze is a claim and a write that delivered nothing.
            row["limited_snoozes"] = relay.snoozes(targets[LIMITED])
            connection.close()
        for proc in procs:
            proc.terminate()
        usages, _ = _reap(procs, 30)
        stats = _stats(url, latencies=True)
    row["server_cpu_s"] = server["cpu"]
    row["exit"] = max(abs(p.returncode or 0) for p in procs)
    row["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usages)
    counts = stats["targets"]
    row["healthy_delivered"] = delivered = sum(counts[t]["delivered"] for t in healthy)
    row["healthy_expected"] = expected
    lasts = [counts[t]["last"] for t in healthy if counts[t]["last"]]
    if not delivered or not lasts or stats["started"] is None:
        return {**row, "error": f"worker exit {row['exit']}: {_last_log_line(suite)}"}
    row["seconds"] = max(lasts) - stats["started"]
    row["per_s"] = delivered / row["seconds"]
    # The healthy targets' requests in flight, on average: what the worker kept busy.
    row["healthy_in_flight"] = sum(counts[t]["busy"] for t in healthy) / row["seconds"]
    if not outage:  # every target's deliveries, the measure before 2026-12-03
        every = [counts[t]["last"] for t in range(20) if counts[t]["last"]]
        row["all_per_s"] = sum(c["delivered"] for c in counts) / (max(every) - stats["started"])
    # The most requests one healthy target had in flight: what a per-target cap leaves it.
    row["healthy_peak"] = max(counts[t]["peak"] for t in healthy)
    latencies = [s for t in healthy for s in stats["latencies"][t]]
    row["p50_s"], row["p99_s"] = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    if outage:
        dead, limited = counts[DEAD], counts[LIMITED]
        row["dead_peak"], row["dead_requests"] = dead["peak"], dead["requests"]
        row["limited_requests"], row["limited_429"] = limited["requests"], limited["too_many"]
        row["limited_delivered"] = limited["delivered"]
        row["limited_above_pct"] = limited["too_many"] / max(limited["requests"], 1) * 100
        connection.ensure_connection()
        row["limited_lost_after_stop"] = relay.lost(targets[LIMITED])
    return row


def relay(suite: Suite, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scenario this system can express, in the order of the report."""
    cls = RELAY_SYSTEMS.get(suite.system.name)
    if cls is None:
        return []
    if find_spec("aiohttp") is None:
        print("   relay: skipped, aiohttp missing", file=sys.stderr)
        return []
    adapter = cls()
    rows: list[dict[str, Any]] = []
    for scenario in sizes.get("relay_scenarios", SCENARIOS):  # a subset, to study one
        if scenario not in adapter.scenarios:
            continue
        print(f"   relay: {scenario}", file=sys.stderr, flush=True)
        try:
            rows.append(run_scenario(suite, adapter, scenario, sizes))
        except Exception as exc:  # one broken scenario must not hide the others
            rows.append({"scenario": scenario, "error": f"{type(exc).__name__}: {exc}"})
    return rows
