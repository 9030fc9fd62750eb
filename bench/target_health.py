"""What held and open targets cost a claim (SPEC §14: within 20 % with a few hundred).

    BENCH_DB=postgresql BENCH_SYSTEM=intents BENCH_DB_PREFIX=health BENCH_WORK=/tmp/bench-health \\
      /work/main/.venv/bin/python -m bench.target_health [--targets 100000] [--blocked 300] \\
      [--pool-rounds 3]

Every claim leaves out the intents of targets that block: SQLite and
MariaDB look each row they walk up in ``TargetState`` by (kind, target)
(``target_open`` in ``store/sql/common.sql``), PostgreSQL reads the blocking
rows once per statement as a hashed set (``held_targets``).
This enqueues one due intent for each of ``--targets`` targets of a kind with
a breaker, then times the claims a pool makes, each rolled back so that
every claim sees the same table: the claim of 32 above the pool's floor
(most of its claims) and the full claim it makes once a second: five rounds
of 20 of each, the scenarios taking turns, the median of the rounds' medians.
Three tables: no ``TargetState`` row (the common case), and
``--blocked`` targets half held and half open, their intents spread through
the queue, or all at its head (where a pool's backlog of blocked intents
ends up: its floor rises past them, its full claim walks them).

Then the claims as a pool makes them (``--pool-rounds``, 0 to leave out): the
table filled again, no target blocked or ``--blocked`` at the head, and a
real ``run_intent_workers --drain --workers 8`` process of the no-op handler
drains it, timing each of its claims (``BENCH_CLAIM_TIMES``,
``bench/benchapp``); the two scenarios take turns. Reported: the drain's
rate (process start to exit), the claims it made, their mean, and the claim
time the pool spent per 1,000 intents it ran, which is what the held targets
cost its claims: the full claims that walk them come once a second or less
often (``worker/floor.py``). The rows are checked afterwards: every intent of
a healthy target completed, every blocked one still pending and unattempted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

KIND = "bench.noop"  # a handler that returns at once, for the pool's drain
LIMITS = {KIND: {"breaker": {"failures": 5, "cooldown": 30}}}
CLAIMS = 20
ROUNDS = 5
BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, default=100_000)
    parser.add_argument("--blocked", type=int, default=300)
    parser.add_argument("--pool-rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ["BENCH_LIMITS"] = json.dumps(LIMITS)
    from . import settings as bench_settings
    from .suite import Suite, _create_database

    _create_database(bench_settings.VENDOR, bench_settings.NAME)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from django_intents.models import Intent, TargetState
    from django_intents.rules.targets import target_key
    from django_intents.store.memory import ClaimMemory

    call_command("migrate", verbosity=0)
    suite = Suite({})
    suite.reset()
    TargetState.objects.all().delete()
    start = timezone.now() - timedelta(hours=1)
    rows: list[dict[str, Any]] = [
        {
            "kind": KIND,
            "event_id": f"e{i}",
            "target": f"https://partner{i}.example/hook",
            "next_at": start + timedelta(milliseconds=i),
        }
        for i in range(args.targets)
    ]

    def fill() -> None:
        suite.reset()
        for batch in range(0, len(rows), 5000):
            Intent.objects.enqueue_many(rows[batch : batch + 5000])
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f'VACUUM ANALYZE "{Intent._meta.db_table}"')
            elif connection.vendor == "mysql":
                cursor.execute(f"ANALYZE TABLE `{Intent._meta.db_table}`")

    fill()

    def block(indexes: list[int]) -> None:
        TargetState.objects.all().delete()
        now, until = timezone.now(), timezone.now() + timedelta(hours=1)
        TargetState.objects.bulk_create(
            TargetState(
                key=target_key(KIND, rows[i]["target"]),
                kind=KIND,
                target=rows[i]["target"],
                state="held" if n % 2 else "open",
                failures=0 if n % 2 else 5,
                openings=0 if n % 2 else 1,
                until=until,
                updated_at=now,
            )
            for n, i in enumerate(indexes)
        )

    def timed(since_first: bool) -> float:
        memory = ClaimMemory()
        memory.watch_at = time.monotonic() + 3600  # a pool looks twice a second, not per claim
        floor = start - timedelta(seconds=1)
        if since_first:  # the pool's floor: past what its claims found blocked
            floor = min(
                Intent.objects.filter(kind=KIND, target__in=healthy_sample()).values_list(
                    "next_at", flat=True
                )
            )
        times = []
        for _ in range(CLAIMS):
            began = time.perf_counter()
            with transaction.atomic():
                since = floor if since_first else None
                claimed = Intent.objects.claim_many(
                    BATCH, kinds=[KIND], since=since, memory=memory, lease=60
                )
                transaction.set_rollback(True)
            times.append((time.perf_counter() - began) * 1000)
            assert len(claimed) == BATCH
            assert not {i.target for i in claimed} & blocked_targets
        return statistics.median(times)

    blocked_targets: set[str] = set()

    def healthy_sample() -> list[str]:
        return [r["target"] for r in rows[: args.blocked + 1] if r["target"] not in blocked_targets]

    step = max(args.targets // max(args.blocked, 1), 1)
    scenarios = [
        ("none", []),
        (f"{args.blocked} spread", list(range(0, step * args.blocked, step))),
        (f"{args.blocked} at the head", list(range(args.blocked))),
    ]
    print(
        f"{connection.vendor}: {args.targets:,} targets, claims of {BATCH}, median of "
        f"{ROUNDS} rounds of {CLAIMS} claims, the scenarios taking turns, each claim rolled back"
    )
    print("| blocked targets | above the floor ms | ratio | full claim ms | ratio |")
    print("|---|---|---|---|---|")
    floored: dict[str, list[float]] = {name: [] for name, _ in scenarios}
    full: dict[str, list[float]] = {name: [] for name, _ in scenarios}
    for _ in range(ROUNDS):  # in turns, so that a busy moment of the machine hits all alike
        for name, indexes in scenarios:
            block(indexes)
            blocked_targets = {rows[i]["target"] for i in indexes}
            timed(True)  # warm up: plans, caches
            floored[name].append(timed(True))
            full[name].append(timed(False))
    base = scenarios[0][0]
    for name, _ in scenarios:
        above, whole = statistics.median(floored[name]), statistics.median(full[name])
        print(
            f"| {name} | {above:.2f} | {above / statistics.median(floored[base]):.2f} "
            f"| {whole:.2f} | {whole / statistics.median(full[base]):.2f} |",
            flush=True,
        )
    TargetState.objects.all().delete()
    if args.pool_rounds:
        pool(args.pool_rounds, scenarios[0::2], fill, block, rows)


def pool(
    rounds: int,
    scenarios: list[tuple[str, list[int]]],
    fill: Callable[[], None],
    block: Callable[[list[int]], None],
    rows: list[dict[str, Any]],
) -> None:
    """A real pool's drain of the table, none or the head blocked, in turns."""
    from django_intents.models import Intent, TargetState

    print(
        f"\na pool draining {len(rows):,} intents (run_intent_workers --drain --workers 8, "
        f"no-op handler), median of {rounds} rounds, the scenarios taking turns"
    )
    print(
        "| blocked targets | intents/s | ratio | claims | mean claim ms "
        "| claim ms per 1,000 intents | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    figures: dict[str, list[tuple[float, int, float, float]]] = {name: [] for name, _ in scenarios}
    for _ in range(rounds):
        for name, indexes in scenarios:
            fill()
            block(indexes)
            blocked = {rows[i]["target"] for i in indexes}
            with tempfile.TemporaryDirectory() as tmp:
                base = Path(tmp) / "claims"
                began = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "django", "run_intent_workers", "--drain"]
                    + ["--workers", "8", "--kinds", KIND, "-v", "0"],
                    env={**os.environ, "BENCH_CLAIM_TIMES": str(base), "BENCH_STAMPS": tmp},
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                seconds = time.perf_counter() - began
                claims = [
                    float(line)
                    for path in Path(tmp).glob("claims.*")
                    for line in path.read_text().split()
                ]
            ran = len(rows) - len(blocked)
            done = Intent.objects.filter(kind=KIND, state="completed").count()
            left = Intent.objects.filter(kind=KIND, state="pending", attempts=0)
            if done != ran or set(left.values_list("target", flat=True)) != blocked:
                raise RuntimeError(f"{name}: {done} of {ran} completed, {left.count()} left")
            figures[name].append(
                (ran / seconds, len(claims), statistics.mean(claims), sum(claims) / ran)
            )
    TargetState.objects.all().delete()
    base_rate = statistics.median(f[0] for f in figures[scenarios[0][0]])
    base_cost = statistics.median(f[3] for f in figures[scenarios[0][0]])
    for name, _ in scenarios:
        rate = statistics.median(f[0] for f in figures[name])
        count = statistics.median(f[1] for f in figures[name])
        mean = statistics.median(f[2] for f in figures[name])
        cost = statistics.median(f[3] for f in figures[name])
        print(
            f"| {name} | {rate:,.0f} | {rate / base_rate:.2f} | {count:,.0f} | {mean * 1000:.2f} "
            f"| {cost * 1e6:.0f} | {cost / base_cost:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
