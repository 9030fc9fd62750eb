"""What a limited claim costs as a full target's backlog grows.

    BENCH_DB=postgresql BENCH_SYSTEM=intents BENCH_DB_PREFIX=held BENCH_WORK=/tmp/bench-held \\
      .venv-bench/bin/python -m bench.held_backlog [--held 0 1000 10000 50000]

A partner that is down keeps its ``per_target`` places taken, and its due
intents stay ``pending`` at the head of the queue, in order. A claim that
walks the claim index in order reads each one to learn its target, unless
its pool's memory holds that head (PostgreSQL, ``store/postgresql/heldhead.py``). This measures
what the backlog costs a claim. For each backlog size it empties the table,
enqueues that many due intents of one target ("dead"), then 2,000 over 19
others behind them, takes the dead target's four places, makes the full
claim a pool makes once a second, then times the exact claim of 16 a pool
makes above its floor, each claim rolled back so that every claim sees the
same table: the median and the 90th percentile of 60 claims. Any database
works.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

KIND = "bench.relay"
LIMITS = {KIND: {"per_target": 4}}
CLAIMS = 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held", type=int, nargs="+", default=[0, 1000, 10_000, 50_000])
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

    from django_intents.models import Intent
    from django_intents.store.memory import ClaimMemory

    call_command("migrate", verbosity=0)
    suite = Suite({})
    print(f"{connection.vendor}: exact claim of 16 above the floor, {CLAIMS} claims per size")
    print("| held back | median ms | p90 ms |")
    print("|---|---|---|")
    for held in args.held:
        suite.reset()
        start = timezone.now() - timedelta(minutes=10)
        rows = [
            {
                "kind": KIND,
                "event_id": f"dead-{i}",
                "target": "https://dead.example/",
                "next_at": start + timedelta(microseconds=i),
            }
            for i in range(held + 4)
        ]
        rows += [
            {
                "kind": KIND,
                "event_id": f"up-{i}",
                "target": f"https://p{i % 19}.example/",
                "next_at": start + timedelta(minutes=1, microseconds=i),
            }
            for i in range(2000)
        ]
        for batch in range(0, len(rows), 5000):
            Intent.objects.enqueue_many(rows[batch : batch + 5000])
        taken = Intent.objects.claim_many(4, kinds=[KIND], lease=3600)
        assert {i.target for i in taken} == {"https://dead.example/"}, "the dead target's places"
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f'ANALYZE "{Intent._meta.db_table}"')
        floor = start - timedelta(seconds=1)
        # One pool's memory; the full claim it makes once a second finds the head.
        memory = ClaimMemory()
        memory.tight[("limited", KIND)] = time.monotonic() + 60
        with transaction.atomic():
            Intent.objects.claim_many(16, kinds=[KIND], memory=memory)
            transaction.set_rollback(True)
        times = []
        for _ in range(CLAIMS):
            # PostgreSQL: its exact claim, not the gate (the others ignore the memory).
            memory.tight[("limited", KIND)] = time.monotonic() + 60
            began = time.perf_counter()
            with transaction.atomic():
                claimed = Intent.objects.claim_many(16, kinds=[KIND], since=floor, memory=memory)
                transaction.set_rollback(True)
            times.append((time.perf_counter() - began) * 1000)
            assert len(claimed) == 16 and all("dead" not in i.target for i in claimed)
        p90 = statistics.quantiles(times, n=10)[-1]
        print(f"| {held:,} | {statistics.median(times):.2f} | {p90:.2f} |", flush=True)


if __name__ == "__main__":
    main()
