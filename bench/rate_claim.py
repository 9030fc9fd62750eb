"""What a claim of a kind with a ``rate`` costs, against the same claim of a kind without.

    BENCH_DB=postgresql BENCH_DB_PREFIX=rate BENCH_WORK=/tmp/bench-rate \\
      .venv/bin/python -m bench.rate_claim [--targets 20 1000] [--claims 60]

A rated kind's claim (SPEC §14) takes the portable limited claim on every
database: the kinds' lock, one ``rate_starts`` query per rated kind (its
targets' starts inside the window), the scan, the update, and the starts
written (``rate_record``) and pruned (``rate_prune``). For each number of
targets this empties the table and enqueues 2,000 due intents of each kind
over that many targets, then times claims of 16 of one kind, each rolled
back so that every claim sees the same table:

- ``unrated``: the kind without a rate (its usual one-statement claim on
  PostgreSQL);
- ``rated, no starts``: the rated kind, nothing started in the window;
- ``rated, 5 starts per target``: the window holds five starts of every
  target (the rate, 10 per hour, still has room): ``rate_starts`` reads them;
- ``rated, half spent``: half the targets used their 10 starts, the scan
  leaves them out.

Prints the median and the 90th percentile in milliseconds. Any database works.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

RATED, UNRATED = "bench.relay", "bench.noop"
RATE = {"count": 10, "text": "10/h"}
DUE = 2000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[20, 1000])
    parser.add_argument("--claims", type=int, default=60)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ["BENCH_LIMITS"] = json.dumps({RATED: {"rate": RATE["text"]}})
    from . import settings as bench_settings
    from .suite import Suite, _create_database

    _create_database(bench_settings.VENDOR, bench_settings.NAME)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from django_intents.models import Intent, TargetStart
    from django_intents.rules.targets import target_key

    call_command("migrate", verbosity=0)
    suite = Suite({})

    def timed(kind: str) -> tuple[float, float]:
        def claim() -> int:
            with transaction.atomic():
                claimed = Intent.objects.claim_many(16, kinds=[kind], lease=3600)
                transaction.set_rollback(True)
            return len(claimed)

        assert claim() == 16  # and warm the connection's statements
        times = []
        for _ in range(args.claims):
            began = time.perf_counter()
            claim()
            times.append((time.perf_counter() - began) * 1000)
        return statistics.median(times), statistics.quantiles(times, n=10)[-1]

    def emptied() -> None:
        """No start left, and no dead row of one (PostgreSQL) for the claims to step over."""
        table = connection.ops.quote_name(TargetStart._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table}" if connection.vendor == "sqlite" else f"TRUNCATE {table}"
            )

    def started(targets: int, per_target: Callable[[int], int]) -> None:
        emptied()
        now = timezone.now()
        rows = [
            TargetStart(
                target_key=target_key(RATED, f"https://p{t}.example/"),
                kind=RATED,
                target=f"https://p{t}.example/",
                started_at=now - timedelta(minutes=1 + s),
            )
            for t in range(targets)
            for s in range(per_target(t))
        ]
        TargetStart.objects.bulk_create(rows, batch_size=2000)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {connection.ops.quote_name(TargetStart._meta.db_table)}")

    print(f"{connection.vendor}: claims of 16 of {DUE:,} due intents, {args.claims} per case")
    print("| targets | case | median ms | p90 ms |")
    print("|---|---|---|---|")
    for targets in args.targets:
        suite.reset()
        start = timezone.now() - timedelta(minutes=10)
        for kind in (RATED, UNRATED):
            rows = [
                {
                    "kind": kind,
                    "event_id": f"{kind}-{i}",
                    "target": f"https://p{i % targets}.example/",
                    "next_at": start + timedelta(microseconds=i),
                }
                for i in range(DUE)
            ]
            Intent.objects.enqueue_many(rows)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f'ANALYZE "{Intent._meta.db_table}"')
        cases: list[tuple[str, str, Callable[[int], int] | None]] = [
            ("unrated", UNRATED, None),
            ("rated, no starts", RATED, lambda t: 0),
            ("rated, 5 starts per target", RATED, lambda t: 5),
            ("rated, half spent", RATED, lambda t: RATE["count"] if t % 2 else 0),
        ]
        for name, kind, per_target in cases:
            if per_target is not None:
                started(targets, per_target)
            median, p90 = timed(kind)
            print(f"| {targets:,} | {name} | {median:.2f} | {p90:.2f} |", flush=True)


if __name__ == "__main__":
    main()
