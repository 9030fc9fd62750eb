"""History: a drain on a table that stores millions of finished intents, beside an empty one.

    .venv/bin/python -m bench.history [--history 5000000] [--n 20000] [--rounds 3]
                                      [--workers 8] [--prune-days 24] [--json out.json]

Finished intents stay in the table until ``RETENTION`` removes them, so a
queue that keeps a month of them drains beside millions of rows. Issue 38
asks that a drain of ``--n`` no-op intents over ``--history`` finished ones
run at 0.9 or more of the rate on an empty table, start and end included,
and that its claims cost at most 1.1 times as much.

Two databases on the same PostgreSQL: ``histempty_intents`` and
``histfull_intents`` (``BENCH_HISTORY_SUFFIX`` after each prefix), the
second filled once by the server from a series (``--history`` completed
intents of the drained kind, created over the last 30 days), moved out of
the live partition into their days as the pools move them (PostgreSQL's
layout since migration 0018), then ``VACUUM ANALYZE``-ed as autovacuum
would leave it. Each round
enqueues ``--n`` intents into each (through ``enqueue_many``, in a process of
its own) and times one ``run_intent_workers --drain`` process per database
from start to exit, in an order that turns every round; the pool's claims
are timed as ``bench/mvcc.py`` times them. Every drained intent is checked
completed. With ``--prune-days`` it then runs ``prune_intents`` on the full
table with completed intents deleted after that many days, and reports how
long it took and the dead tuples it left (issue 38: 1,000,000 in 2 s, none
left for vacuum).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import graphile_compare as graphile  # noqa: E402 - it sets its own environment
from bench import mvcc  # noqa: E402

# BENCH_DB_PREFIX of each database; two runs on one server (CI's Django versions
# side by side) take a suffix each.
_SUFFIX = os.environ.get("BENCH_HISTORY_SUFFIX", "")
TABLES = {"empty": f"histempty{_SUFFIX}", "full": f"histfull{_SUFFIX}"}
KIND = "bench.noop"
# Every finished intent out of the live partition, as the pools move them
# (maintenance/retention.move_finished); nothing to move on a table of one piece.
MOVE_ALL = (
    "import django; django.setup()\n"
    "from django_intents.maintenance.retention import move_finished\n"
    "while move_finished():\n"
    "    pass\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--prune-days",
        type=float,
        help="then prune_intents with completed intents deleted after this many days "
        "(24: the oldest fifth of the history)",
    )
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--enqueue", type=int, help=argparse.SUPPRESS)  # the enqueuing process
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.enqueue is not None:
        return enqueue(args.enqueue, args.tag, args.prefix)
    if args.history < 0 or args.n <= 0 or args.rounds <= 0:
        parser.error("--history must be 0 or more, --n and --rounds more than 0")

    from bench.suite import _create_database

    Path(os.environ["BENCH_STAMPS"]).mkdir(parents=True, exist_ok=True)
    urls = {}
    for side, prefix in TABLES.items():
        _create_database("postgresql", f"{prefix}_intents")
        urls[side] = graphile._url(f"{prefix}_intents")
        run_django(prefix, ["-m", "django", "migrate", "-v", "0"])
        truncate(urls[side])
    began = time.monotonic()
    fill(urls["full"], args.history)
    print(f"stored {args.history:,} finished intents in {time.monotonic() - began:.0f} s")
    began = time.monotonic()
    run_django(TABLES["full"], ["-c", MOVE_ALL])  # on PostgreSQL, into their days
    with mvcc.connect(urls["full"]) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"moved out of the live rows and vacuumed in {time.monotonic() - began:.0f} s")
    for side in TABLES:  # untimed: caches and plans
        drain(side, urls[side], min(args.n, 2_000), args.workers, tag="warm")

    runs: list[dict[str, Any]] = []
    sides = list(TABLES)
    for number in range(args.rounds):
        for side in sides[number % 2 :] + sides[: number % 2]:
            row = drain(side, urls[side], args.n, args.workers, tag=f"r{number}")
            runs.append({"round": number + 1, "side": side, **row})
            print(
                f"round {number + 1}: {side:5} {row['per_s']:8,.0f}/s  claims {row['claims']:4}"
                f"  p50 {row['claim_p50_ms']:6.1f} ms  p99 {row['claim_p99_ms']:6.1f} ms"
                f"  total {row['claim_total_s']:5.2f} s",
                flush=True,
            )
    report = summarise(runs, args)
    if args.prune_days is not None:
        report["prune"] = prune(urls["full"], args.prune_days)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def run_django(prefix: str, argv: list[str], **env: str) -> None:
    environment = {**os.environ, "BENCH_DB_PREFIX": prefix, **env}
    subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=environment, check=True, stdout=subprocess.DEVNULL
    )


def truncate(url: str) -> None:
    with mvcc.connect(url) as conn:
        conn.execute("TRUNCATE django_intents_intent")


def fill(url: str, rows: int) -> None:
    """``rows`` completed intents of ``KIND``, written by the server, 500,000 a statement.

    Their ids are made as ``rules.identity`` makes them, so they sit in the
    primary key where real ones would; a row's times spread over 30 days.
    """
    with mvcc.connect(url) as conn:
        for first in range(0, rows, 500_000):
            last = min(first + 500_000, rows) - 1
            conn.execute(
                """
                INSERT INTO django_intents_intent (id, kind, event_id, target, payload, state,
                    attempts, snoozes, written_off, priority, next_at, created_at, updated_at,
                    last_error, last_traceback, claim_token, claim_until, trace_context)
                SELECT encode(sha256(convert_to(%(kind)s, 'UTF8') || '\\x00'::bytea
                    || convert_to(e, 'UTF8') || '\\x00'::bytea || convert_to(t, 'UTF8')), 'hex'),
                    %(kind)s, e, t, jsonb_build_object('n', i), 'completed', 1, 0, 0, 0,
                    a, a, a + interval '10 milliseconds', '', '', '', NULL, ''
                FROM (SELECT i, CONCAT('history-', i) AS e,
                    CONCAT('https://partner-', MOD(i, 50), '.example/hook') AS t,
                    now() - interval '30 days' + i * (interval '30 days' / %(rows)s) AS a
                    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g(i)) AS s
                """,
                {"kind": KIND, "rows": max(rows, 1), "first": first, "last": last},
            )
        conn.execute("VACUUM ANALYZE django_intents_intent")


def enqueue(n: int, tag: str, prefix: str) -> int:
    """In a process of its own (``--enqueue``): ``n`` intents through ``enqueue_many``."""
    os.environ["BENCH_DB_PREFIX"] = prefix  # importing bench.mvcc set its own
    import django

    django.setup()
    from django_intents.models import Intent

    for start in range(0, n, 500):
        Intent.objects.enqueue_many(
            {"kind": KIND, "event_id": f"{tag}-{i}", "target": "bench", "payload": {}}
            for i in range(start, min(start + 500, n))
        )
    return 0


def drain(side: str, url: str, n: int, workers: int, *, tag: str) -> dict[str, Any]:
    prefix = TABLES[side]
    run_django(
        prefix, ["-m", "bench.history", "--enqueue", str(n), "--tag", tag, "--prefix", prefix]
    )
    with tempfile.TemporaryDirectory() as tmp:
        times = Path(tmp) / "claims"
        argv = ["-m", "django", "run_intent_workers", "--drain", "--workers", str(workers)]
        began = time.perf_counter()
        run_django(prefix, [*argv, "--kinds", KIND, "-v", "0"], BENCH_CLAIM_TIMES=str(times))
        seconds = time.perf_counter() - began
        claims = sorted(mvcc.read_times(times))
    with mvcc.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM django_intents_intent WHERE event_id LIKE %s "
            "AND state <> 'completed'",
            [f"{tag}-%"],
        ).fetchone()
    if row and row[0]:
        raise RuntimeError(f"{side}: {row[0]} of {n} intents left after the drain of {tag}")
    return {
        "per_s": n / seconds,
        "seconds": seconds,
        "claims": len(claims),
        "claim_p50_ms": 1000 * statistics.median(claims),
        "claim_p99_ms": 1000 * claims[min(len(claims) - 1, int(len(claims) * 0.99))],
        "claim_total_s": sum(claims),
    }


def prune(url: str, days: float) -> dict[str, Any]:
    """``manage.py prune_intents`` on the full table, timed; the dead tuples it leaves."""
    before = completed(url)
    environment = {**os.environ, "BENCH_DB_PREFIX": TABLES["full"], "BENCH_DELETE_DAYS": str(days)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "django", "prune_intents"],
        cwd=ROOT,
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - began
    deleted = before - completed(url)
    after = mvcc.table_figures("intents", url)
    print(
        f"prune_intents: {deleted:,} completed intents deleted in {seconds:.1f} s"
        f" ({deleted / seconds:,.0f}/s); {after['dead']:,} dead tuples left for vacuum;"
        f" it said: {done.stdout.strip()}"
    )
    return {
        "seconds": seconds,
        "deleted": deleted,
        "dead_after": after["dead"],
        "said": done.stdout,
    }


def completed(url: str) -> int:
    with mvcc.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM django_intents_intent WHERE state = 'completed'"
        ).fetchone()
    return int(row[0]) if row else 0


def summarise(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    medians = {}
    for side in TABLES:
        mine = [run for run in runs if run["side"] == side]
        medians[side] = {
            key: statistics.median(run[key] for run in mine)
            for key in ("per_s", "claim_p50_ms", "claim_p99_ms", "claim_total_s")
        }
    rate = medians["full"]["per_s"] / medians["empty"]["per_s"]
    cost = medians["full"]["claim_total_s"] / medians["empty"]["claim_total_s"]
    print(
        f"\n{args.n:,} no-op intents, {args.workers} workers, medians of {args.rounds} rounds:"
        f"\n  empty table           {medians['empty']['per_s']:8,.0f}/s"
        f"\n  {args.history:>9,} finished   {medians['full']['per_s']:8,.0f}/s"
        f"\n  rate ratio {rate:.2f}, claim time ratio {cost:.2f}"
    )
    return {
        "history": args.history,
        "n": args.n,
        "workers": args.workers,
        "runs": runs,
        "medians": medians,
        "rate_ratio": rate,
        "claim_time_ratio": cost,
    }


if __name__ == "__main__":
    sys.exit(main())
