"""The relay workload over one PostgreSQL server and over two (issue 41).

    .venv/bin/python -m bench.shards --n 20000 --rounds 3 --concurrency 300

Starts a second PostgreSQL cluster on another port (``initdb`` in a
temporary directory, as the ``postgres`` user, the same ``shared_buffers``
and ``max_connections`` as the first; stopped and removed after), and a
partner of twenty targets answering 200 after 50 ms
(``bench/relay_server.py``). Each round, in turns:

- **one shard:** ``n`` relay intents, all on the first server, drained by one
  ``run_intent_workers --drain --all-databases`` process;
- **two shards:** the same ``n`` intents spread over both servers by
  ``TargetShardRouter`` (each target on one of them), drained by one
  process serving both (a pool per database, each with ``--concurrency``
  deliveries in flight).

Each drain is timed from the process's start to its exit; every intent is
checked completed afterwards, on its database. The CPU time of each server
(every process of its cluster, reaped backends included: the postmaster's
``cutime`` and ``cstime``) is read from ``/proc`` before and after, and so is
the worker's. On this 2-core machine the servers, the worker and the
partner share two cores, so two shards cannot drain twice as fast here; what
the run gives is each server's CPU per intent, from which the report
derives what N shards on N machines would do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from .io_workload import _free_port

ROOT = Path(__file__).resolve().parent.parent
HOST = os.environ.get("PGHOST", "127.0.0.1")
PORT = int(os.environ.get("PGPORT", "5432"))
TARGETS = 20
KIND = "bench.relay"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def run(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=True, capture_output=True, text=True, **kw)


def as_postgres(command: list[str]) -> list[str]:
    """``command`` as the ``postgres`` user: initdb and the server refuse root."""
    return command if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *command]


def setting(name: str) -> str:
    with psycopg.connect(host=HOST, port=PORT, user="postgres", dbname="postgres") as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[0])


@contextmanager
def second_cluster() -> Iterator[int]:
    """A PostgreSQL server of its own on a free port, configured as the first one."""
    directory = Path(tempfile.mkdtemp(prefix="intents-shard-"))
    data = directory / "data"
    port = _free_port()
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    run(as_postgres(["initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]))
    options = (
        f"-p {port} -c listen_addresses={HOST} -c unix_socket_directories={directory} "
        f"-c shared_buffers={setting('shared_buffers')} "
        f"-c max_connections={setting('max_connections')} "
        f"-c synchronous_commit={setting('synchronous_commit')} -c fsync={setting('fsync')}"
    )
    log = directory / "server.log"
    run(as_postgres(["pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "start"]))
    try:
        yield port
    finally:
        subprocess.run(
            as_postgres(["pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
            check=False,
        )
        shutil.rmtree(directory, ignore_errors=True)


def postmaster(port: int) -> int:
    """The pid of the server listening on ``port`` (its data directory's postmaster.pid)."""
    with psycopg.connect(host=HOST, port=port, user="postgres", dbname="postgres") as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])


def cluster_cpu(pid: int) -> float:
    """CPU seconds of a cluster so far: its postmaster with every child, living or reaped."""

    def stat(p: int) -> list[str]:
        text = Path(f"/proc/{p}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()

    fields = stat(pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if int(child[1]) == pid:  # ppid
            total += int(child[11]) + int(child[12])
    return total / CLOCK_TICKS


def recreate(port: int, name: str) -> None:
    with psycopg.connect(
        host=HOST, port=port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def environment(shards: list[tuple[int, str]]) -> dict[str, str]:
    spec = ",".join(f"{HOST}:{port}/{name}" for port, name in shards)
    stamps = Path(tempfile.gettempdir()) / "intents-shard-stamps"  # bench/benchapp/probe.py
    stamps.mkdir(exist_ok=True)
    return {
        "BENCH_STAMPS": str(stamps),
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.shard_settings",
        "BENCH_DB": "postgresql",
        "BENCH_SYSTEM": "intents",
        "BENCH_SHARDS": spec,
        "BENCH_RELAY_POOL": os.environ.get("BENCH_RELAY_POOL", "512"),
    }


def django(env: dict[str, str], *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env, **kw)


FILL = """
import sys, time, django
django.setup()
from django_intents.models import Intent
n, partner = int(sys.argv[1]), sys.argv[2]
at = time.time()
items = [
    {"kind": "bench.relay", "event_id": f"d{i}", "target": f"{partner}/t/{i % 20}",
     "payload": {"at": at}}
    for i in range(n)
]
for start in range(0, n, 5000):
    Intent.objects.enqueue_many(items[start : start + 5000])
"""

COUNT = """
import json, django
django.setup()
from django.conf import settings
from django_intents.models import Intent
print(json.dumps({
    alias: {state: Intent.objects.using(alias).filter(state=state).count()
            for state in ("pending", "running", "completed", "cancelled")}
    for alias in settings.INTENTS["DATABASES"]
}))
"""


def one_drain(
    shards: list[tuple[int, str]], n: int, concurrency: int, partner: str
) -> dict[str, Any]:
    """Fill ``shards`` with ``n`` relay intents, drain them with one process, check the rows."""
    for port, name in shards:
        recreate(port, name)
    env = environment(shards)
    for alias in ["default", *(f"shard{i}" for i in range(1, len(shards)))]:
        django(env, "migrate", "--database", alias, "-v", "0")
    run([sys.executable, "-c", FILL, str(n), partner], cwd=ROOT, env=env)
    servers = {port: postmaster(port) for port, _ in shards}
    before = {port: cluster_cpu(pid) for port, pid in servers.items()}
    started = time.monotonic()
    usage = os.times()
    django(
        env,
        "run_intent_workers",
        "--drain",
        "--all-databases",
        "--concurrency",
        str(concurrency),
        "--kinds",
        KIND,
        "-v",
        "0",
        timeout=600,
    )
    elapsed = time.monotonic() - started
    after_usage = os.times()
    after = {port: cluster_cpu(pid) for port, pid in servers.items()}
    counts = json.loads(run([sys.executable, "-c", COUNT], cwd=ROOT, env=env).stdout)
    completed = {alias: c["completed"] for alias, c in counts.items()}
    unfinished = {alias: c for alias, c in counts.items() if c["completed"] != sum(c.values())}
    if sum(completed.values()) != n or unfinished:
        raise SystemExit(f"not every intent completed: {counts}")
    worker = (after_usage.children_user + after_usage.children_system) - (
        usage.children_user + usage.children_system
    )
    return {
        "rate": n / elapsed,
        "seconds": elapsed,
        "per_database": completed,
        "server_cpu_us": {
            str(port): (after[port] - before[port]) * 1e6 / max(sum(completed.values()), 1)
            for port in servers
        },
        "server_cpu_us_per_own_intent": {
            str(port): (after[port] - before[port])
            * 1e6
            / max(completed["default" if i == 0 else f"shard{i}"], 1)
            for i, port in enumerate(servers)
        },
        "worker_cpu_us": worker * 1e6 / n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=300, help="in flight per database")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    partner_port = _free_port()
    partner = subprocess.Popen(
        [sys.executable, "-m", "bench.relay_server", "--port", str(partner_port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{partner_port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/stats", timeout=1).read()  # noqa: S310
                break
            except OSError:
                time.sleep(0.1)
        results: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
        with second_cluster() as port:
            one = [(PORT, "bench_shard_a")]
            two = [(PORT, "bench_shard_a"), (port, "bench_shard_b")]
            for round_number in range(args.rounds):
                order = [("one", one), ("two", two)]
                if round_number % 2:
                    order.reverse()
                for label, shards in order:
                    result = one_drain(shards, args.n, args.concurrency, url)
                    results[label].append(result)
                    held = result["server_cpu_us_per_own_intent"]
                    cpu = ", ".join(f"port {p}: {v:.1f}" for p, v in held.items())
                    print(
                        f"round {round_number + 1}, {label} shard(s): {result['rate']:,.0f}/s; "
                        f"intents per database {result['per_database']}; server CPU per "
                        f"intent it held {cpu} µs; worker {result['worker_cpu_us']:.0f} µs",
                        flush=True,
                    )
    finally:
        partner.terminate()
        partner.wait(10)
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    one_rate, two_rate = median("one", "rate"), median("two", "rate")
    one_server = statistics.median(
        next(iter(r["server_cpu_us_per_own_intent"].values())) for r in results["one"]
    )
    two_servers = [
        statistics.median(
            list(r["server_cpu_us_per_own_intent"].values())[i] for r in results["two"]
        )
        for i in range(2)
    ]
    worker = median("two", "worker_cpu_us")
    print()
    print(f"relay workload, {args.n:,} intents, {args.rounds} rounds, medians:")
    print(f"  one shard:  {one_rate:,.0f}/s; server CPU {one_server:.1f} µs per intent")
    print(
        f"  two shards: {two_rate:,.0f}/s ({two_rate / one_rate:.2f}x); server CPU "
        f"{two_servers[0]:.1f} and {two_servers[1]:.1f} µs per intent each held; "
        f"worker {worker:.0f} µs per intent"
    )
    per_shard = max(two_servers)
    print(
        f"  one server core drains at most {1e6 / per_shard:,.0f} intents/s of its shard; "
        f"N shards on N machines: about N x that, with workers enough "
        f"({1e6 / worker:,.0f}/s per worker core here)"
    )


if __name__ == "__main__":
    sys.exit(main())
