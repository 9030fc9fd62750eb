"""What held and open targets cost a claim (SPEC §14: within 20 % with a few hundred).

    BENCH_DB=postgresql BENCH_SYSTEM=intents BENCH_DB_PREFIX=health BENCH_WORK=/tmp/bench-health \\
      /work/main/.venv/bin/python -m bench.target_health [--targets 100000] [--blocked 300]

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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

KIND = "bench.relay"
LIMITS = {KIND: {"breaker": {"failures": 5, "cooldown": 30}}}
CLAIMS = 20
ROUNDS = 5
BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, default=100_000)
    parser.add_argument("--blocked", type=int, default=300)
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
    rows = [
        {
            "kind": KIND,
            "event_id": f"e{i}",
            "target": f"https://partner{i}.example/hook",
            "next_at": start + timedelta(milliseconds=i),
        }
        for i in range(args.targets)
    ]
    for batch in range(0, len(rows), 5000):
        Intent.objects.enqueue_many(rows[batch : batch + 5000])
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f'VACUUM ANALYZE "{Intent._meta.db_table}"')
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE `{Intent._meta.db_table}`")

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


if __name__ == "__main__":
    main()
