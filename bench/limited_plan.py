"""The plans of a pool's limited claims on a churned table, as PostgreSQL ran them.

    BENCH_DB=postgresql BENCH_SYSTEM=intents BENCH_DB_PREFIX=plan BENCH_WORK=/tmp/bench-plan \\
      .venv-bench/bin/python -m bench.limited_plan [--churned 500000]

Issue 15 asks that the claim stay on its index with 500,000 churned rows.
This leaves that many finished intents behind through the real claim and
completion (autovacuum off for the table, so that every dead row and index
entry stays), enqueues 2,000 due intents over 20 targets, claims 60 of them
as a pool would, then makes the claims a pool of a limited kind makes: the
plain claim with room above the floor and without it, and the exact claim
with the pool's finished successes completed in the same round trip. Every
statement is explained by ``auto_explain`` at ``NOTICE`` level, loaded for
this connection only, and printed as the server sent it: ``EXPLAIN
(ANALYZE, BUFFERS)`` of the statements exactly as the backend sends them.
Each claim runs in a transaction that is rolled back, so each sees the
same table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from typing import Any

KIND = "bench.relay"
LIMITS = {KIND: {"running": 200, "per_target": 4}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--churned", type=int, default=500_000)
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

    from django_intents.models import Intent
    from django_intents.store.memory import ClaimMemory

    if connection.vendor != "postgresql":
        raise SystemExit("bench.limited_plan explains PostgreSQL's claims: set BENCH_DB=postgresql")
    call_command("migrate", verbosity=0)
    suite = Suite({})
    suite.reset()
    table = Intent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" SET (autovacuum_enabled = false)')
    started = time.perf_counter()
    suite.system.churn(args.churned)
    print(f"churned {args.churned:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
    Intent.objects.enqueue_many(
        [
            {"kind": KIND, "event_id": f"due-{i}", "target": f"https://p{i % 20}.example/"}
            for i in range(2000)
        ]
    )
    memory = ClaimMemory()  # the pool's: what its claims remember between turns
    first = Intent.objects.claim_many(60, kinds=[KIND], memory=memory)
    finished = [(i.id, i.claim_token) for i in first[:16]]
    floor = min(i.next_at for i in first) - timedelta(seconds=1)

    notices: list[str] = []
    connection.ensure_connection()
    connection.connection.add_notice_handler(
        lambda diag: notices.append(diag.message_primary or "")
    )
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting, value in [
            ("log_min_duration", "0"),
            ("log_analyze", "on"),
            ("log_buffers", "on"),
            ("log_timing", "on"),
            ("log_level", "notice"),
        ]:
            cursor.execute(f"SET auto_explain.{setting} = {value}")

    key = ("limited", KIND)

    def explain(title: str, limit: int, *, tight: bool, **kwargs: Any) -> None:
        # The exact statement, as for a second after a claim that found too
        # little room; else the plain one behind the gate first.
        memory.tight[key] = time.monotonic() + 60 if tight else 0.0
        notices.clear()
        with transaction.atomic():
            claimed = Intent.objects.claim_many(limit, kinds=[KIND], memory=memory, **kwargs)
            transaction.set_rollback(True)
        print(f"\n## {title}: {len(claimed)} claimed, {len(claimed.completed)} completed\n")
        for notice in notices:
            print(notice.strip(), "\n")

    # 60 running over 20 targets, some of them at per_target 4.
    explain(
        "a claim of 1 above the floor: the gate, then the exact claim", 1, tight=False, since=floor
    )
    explain("exact claim of 16, above the floor (a pool's claim)", 16, tight=True, since=floor)
    explain("exact claim of 16, every branch, no floor (a full claim)", 16, tight=True)
    explain(
        "exact claim of 16 above the floor, 16 finished claims completed first",
        16,
        tight=True,
        since=floor,
        complete=finished,
    )


if __name__ == "__main__":
    main()
