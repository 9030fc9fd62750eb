"""Bloat pressure: waves of work while another transaction holds back vacuum.

    .venv/bin/python -m bench.mvcc [--waves 10] [--n 50000] [--workers 8]
                                   [--systems intents,graphile] [--json out.json]

A transaction left open anywhere on a PostgreSQL database (an analytics query,
a forgotten ``psql``) keeps every row version its snapshot might see: dead
entries pile up in a queue's indexes, and each claim walks further. Here a
REPEATABLE READ transaction on another connection holds its snapshot on each
system's database for the whole run, while ``--waves`` waves of ``--n``
no-op jobs are enqueued and drained by one process of ``--workers`` (issue 38:
the mean rate of the last three waves at least 0.8 of the first two, claim
p99 under 20 ms). graphile-worker (``bench/graphile``) goes through the same
waves in the same run, the systems alternating within each wave.

Each wave reports the drain's rate (process start to exit), the enqueue's, the
table's dead tuples and its size with indexes (``pg_stat_user_tables``,
``pg_total_relation_size``; PostgreSQL 15 or later, whose
``pg_stat_force_next_flush`` makes them current) and, for django-intents, the p50 and p99 of its
claims as the pool timed them (``BENCH_CLAIM_TIMES``, ``bench/benchapp``).
After the last wave the blocker ends, the bench waits up to ``--settle``
seconds for autovacuum (or runs a plain ``VACUUM`` where it is off) and
reports the dead tuples and sizes again, then runs one more wave without
the blocker: a queue whose table returns to its working size and rate needs
no ``VACUUM FULL``.

Finished intents stay in django-intents' table until ``RETENTION`` removes
them, so its table grows by ``--n`` rows a wave whatever the blocker does;
graphile-worker deletes a job when it completes.
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
# Two runs on one server (CI's Django versions side by side) need databases of their own.
PREFIX = os.environ.get("BENCH_MVCC_PREFIX", "mvcc")
SYSTEMS = ("intents", "graphile")

from bench import graphile_compare as graphile  # noqa: E402 - it sets its own environment

os.environ.update(BENCH_DB="postgresql", BENCH_SYSTEM="intents", BENCH_DB_PREFIX=PREFIX)
os.environ["BENCH_STAMPS"] = str(graphile.WORK / "mvcc-stamps")  # bench.noop writes its start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--n", type=int, default=50_000, help="jobs per wave")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--settle", type=float, default=120.0, help="seconds to wait for autovacuum"
    )
    parser.add_argument("--no-blocker", action="store_true", help="the same waves, vacuum free")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    systems = [name for name in args.systems.split(",") if name]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        parser.error(f"--systems takes {', '.join(SYSTEMS)}, not {args.systems!r}")

    urls = prepare(systems)
    warm = min(args.n, 5_000)
    for name in systems:  # untimed: caches, plans, the first autovacuum of an empty table
        wave(name, warm, args.workers, urls[name], tag="warm")
    blockers = [] if args.no_blocker else [block(urls[name]) for name in systems]
    report: dict[str, Any] = {
        "n": args.n,
        "waves": args.waves,
        "workers": args.workers,
        "blocker": not args.no_blocker,
        "systems": {name: {"waves": []} for name in systems},
    }
    try:
        for number in range(args.waves):
            turn = number % len(systems)
            for name in systems[turn:] + systems[:turn]:
                row = wave(name, args.n, args.workers, urls[name], tag=f"w{number}")
                report["systems"][name]["waves"].append(row)
                print(line(name, number + 1, row), flush=True)
        if blockers:
            held = [held_back(url) for url in (urls[name] for name in systems)]
            report["held_back_xmin"] = held
    finally:
        for conn in blockers:
            conn.rollback()
            conn.close()
    for name in systems:
        report["systems"][name]["after"] = settle(name, urls[name], args.settle)
    for name in systems:  # the blocker gone and the dead rows removed: the rate again
        row = wave(name, args.n, args.workers, urls[name], tag="free")
        report["systems"][name]["after_wave"] = row
        print(line(name, args.waves + 1, row) + "  (no blocker)", flush=True)
    summarise(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def prepare(systems: list[str]) -> dict[str, str]:
    """A database per system, migrated and emptied; graphile-worker installed."""
    from bench.suite import _create_database

    Path(os.environ["BENCH_STAMPS"]).mkdir(parents=True, exist_ok=True)
    urls = {}
    for name in systems:
        database = f"{PREFIX}_{name}"
        _create_database("postgresql", database)
        urls[name] = graphile._url(database)
    if "graphile" in systems:
        graphile.install()
        graphile.node(["migrate"], urls["graphile"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if "intents" in systems:
        from django.db import connection

        from django_intents.models import Intent

        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {Intent._meta.db_table}")
        connection.close()
    if "graphile" in systems:
        with connect(urls["graphile"]) as conn:
            conn.execute(
                "TRUNCATE graphile_worker._private_jobs, graphile_worker._private_job_queues"
            )
    return urls


def connect(url: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, **kwargs)


def block(url: str) -> Any:
    """A REPEATABLE READ transaction whose snapshot stays until the run ends.

    Its first statement takes the snapshot; from then on the server keeps
    every row version that snapshot may see, in every table of that database.
    """
    import psycopg

    conn = psycopg.connect(url)
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.execute("SELECT count(*) FROM pg_class").fetchone()
    return conn


def held_back(url: str) -> bool:
    """Whether a session of that database still holds back its vacuum horizon."""
    with connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND state LIKE 'idle in%'"
        ).fetchone()
    return bool(row and row[0])


def wave(name: str, n: int, workers: int, url: str, *, tag: str) -> dict[str, Any]:
    """Enqueue ``n`` jobs, then time one process draining them; check none is left."""
    began = time.perf_counter()
    if name == "intents":
        enqueue_intents(n, tag)
    else:
        graphile_add(url, n)
    enqueued = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp:
        times = Path(tmp) / "claims"
        if name == "intents":
            argv = [sys.executable, "-m", "django", "run_intent_workers", "--drain"]
            argv += ["--workers", str(workers), "--kinds", "bench.noop", "-v", "0"]
            env = {**os.environ, "BENCH_CLAIM_TIMES": str(times)}
        else:
            argv = ["node", str(graphile.NODE / "drain.js"), str(workers), "batched"]
            env = {**os.environ, "DATABASE_URL": url}
        began = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - began
        claims = read_times(times) if name == "intents" else []
    left = intents_left(tag) if name == "intents" else graphile.graphile_left(url)
    if left:
        raise RuntimeError(f"{name}: {left} of {n} jobs left after the drain of wave {tag}")
    row: dict[str, Any] = {
        "per_s": n / seconds,
        "seconds": seconds,
        "enqueue_per_s": n / enqueued,
        **table_figures(name, url),
    }
    if claims:
        ordered = sorted(claims)
        row["claims"] = len(ordered)
        row["claim_p50_ms"] = 1000 * statistics.median(ordered)
        row["claim_p99_ms"] = 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return row


def enqueue_intents(n: int, tag: str) -> None:
    from django.db import connection

    from django_intents.models import Intent

    for start in range(0, n, 500):
        Intent.objects.enqueue_many(
            {"kind": "bench.noop", "event_id": f"{tag}-{i}", "target": "bench", "payload": {}}
            for i in range(start, min(start + 500, n))
        )
    connection.close()


def intents_left(tag: str) -> int:
    from django.db import connection

    from django_intents.models import Intent

    left = Intent.objects.filter(event_id__startswith=f"{tag}-").exclude(state="completed").count()
    connection.close()
    return left


def graphile_add(url: str, n: int) -> None:
    with connect(url) as conn:
        for start in range(0, n, 5000):
            conn.execute(
                "SELECT count(graphile_worker.add_job('noop', json_build_object('n', n))) "
                "FROM generate_series(%s::int, %s::int) AS n",
                [start, min(start + 5000, n) - 1],
            )


def read_times(base: Path) -> list[float]:
    """The claim durations every worker process wrote (``base.<pid>``), in seconds."""
    found: list[float] = []
    for path in base.parent.glob(base.name + ".*"):
        found.extend(float(value) for value in path.read_text().split())
    return found


def table_figures(name: str, url: str) -> dict[str, Any]:
    """Dead tuples and size, with indexes and TOAST, of the system's job table."""
    table = "django_intents_intent" if name == "intents" else "_private_jobs"
    schema = "public" if name == "intents" else "graphile_worker"
    with connect(url) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        # django-intents' table on PostgreSQL is partitioned (migration 0018): its
        # partitions, and the key table, hold its rows.
        row = conn.execute(
            "SELECT count(*), sum(n_live_tup), sum(n_dead_tup), sum(pg_total_relation_size(relid)) "
            "FROM pg_stat_user_tables WHERE schemaname = %(schema)s AND (relname = %(table)s "
            "OR relname = 'django_intents_key' OR relid IN (SELECT inhrelid FROM pg_inherits "
            "WHERE inhparent = to_regclass(%(qualified)s)))",
            {"schema": schema, "table": table, "qualified": f"{schema}.{table}"},
        ).fetchone()
    if not row or not row[0]:
        raise RuntimeError(f"{name}: no table {schema}.{table}")
    _, live, dead, size = (int(value) for value in row)
    return {"live": live, "dead": dead, "mb": size / 2**20}


def settle(name: str, url: str, wait: float) -> dict[str, Any]:
    """The table once the blocker is gone: autovacuum's work, waited for.

    Where the server runs without autovacuum (this machine's benchmark server
    does, so that no run pays for another's dead rows), a plain ``VACUUM`` of
    the table stands in for it: never ``VACUUM FULL``, which locks the table.
    """
    table = "django_intents_intent" if name == "intents" else "graphile_worker._private_jobs"
    with connect(url) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        autovacuum = bool(row and row[0] == "on")
        began = time.monotonic()
        if not autovacuum:
            keys = conn.execute("SELECT to_regclass('django_intents_key')").fetchone()[0]
            conn.execute(
                f"VACUUM {table}" + (", django_intents_key" if name == "intents" and keys else "")
            )
    deadline = began + wait
    figures = table_figures(name, url)
    while figures["dead"] > 0.05 * max(figures["live"], 1) and time.monotonic() < deadline:
        time.sleep(2)
        figures = table_figures(name, url)
    how = "autovacuum" if autovacuum else "VACUUM (autovacuum is off on this server)"
    return {**figures, "by": how, "waited_s": time.monotonic() - began}


def line(name: str, number: int, row: dict[str, Any]) -> str:
    claims = ""
    if "claim_p99_ms" in row:
        claims = f"  claims p50 {row['claim_p50_ms']:6.1f} ms p99 {row['claim_p99_ms']:6.1f} ms"
    return (
        f"wave {number:2}: {name:8} {row['per_s']:8,.0f}/s  enqueue {row['enqueue_per_s']:7,.0f}/s"
        f"  dead {row['dead']:9,}  {row['mb']:7.1f} MB{claims}"
    )


def summarise(report: dict[str, Any]) -> None:
    blocker = "a REPEATABLE READ snapshot held open" if report["blocker"] else "no blocker"
    print(f"\n{report['waves']} waves of {report['n']:,} no-op jobs, {blocker}:")
    for name, figures in report["systems"].items():
        rates = [row["per_s"] for row in figures["waves"]]
        first = statistics.mean(rates[:2])
        last = statistics.mean(rates[-3:])
        figures["first_two_per_s"], figures["last_three_per_s"] = first, last
        figures["ratio"] = last / first
        p99s = [row["claim_p99_ms"] for row in figures["waves"] if "claim_p99_ms" in row]
        worst = f", claim p99 at most {max(p99s):.1f} ms" if p99s else ""
        after, free = figures["after"], figures["after_wave"]
        print(
            f"  {name:8} first two {first:8,.0f}/s, last three {last:8,.0f}/s, "
            f"ratio {last / first:.2f}{worst}; after the blocker, by {after['by']}: "
            f"{after['dead']:,} dead, {after['mb']:.1f} MB ({after['waited_s']:.0f} s); "
            f"then a wave at {free['per_s']:,.0f}/s, {free['mb']:.1f} MB"
        )


if __name__ == "__main__":
    sys.exit(main())
