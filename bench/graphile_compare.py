"""graphile-worker beside django-intents: no-op jobs drained by one process, whole process.

    .venv-bench/bin/python bench/graphile_compare.py [--n 20000] [--rounds 3] \\
        [--workers 8] [--json out.json]

graphile-worker (Node.js, PostgreSQL) is the fastest published database-backed
queue, and the mark issue 19 sets. npm installs the version that
``bench/graphile/package.json`` pins into ``.tmp/bench/graphile`` (under
``BENCH_WORK`` if set), once. Each round enqueues ``--n`` no-op jobs (untimed) and drains
them with each configuration in turn, in an order that turns every round:

- ``graphile``: ``runOnce`` with ``--workers`` concurrent jobs, its defaults;
- ``graphile batched``: the same with its fastest documented settings, a local
  queue of 500 jobs fetched per statement and completions batched at once;
- ``intents``: ``run_intent_workers --drain --workers N``.

Each is timed from process start to exit, start-up included, as both are
used from a command line, and afterwards every job is checked done. Each
system has a database of its own on the same PostgreSQL (``graphilecmp_*``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = Path(os.environ.get("BENCH_WORK", ROOT / ".tmp" / "bench"))
NODE = WORK / "graphile"
PREFIX = "graphilecmp"
CONFIGS = ("graphile", "graphile batched", "intents")

os.environ.update(
    BENCH_DB="postgresql",
    BENCH_SYSTEM="intents",
    BENCH_DB_PREFIX=PREFIX,
    BENCH_STAMPS=str(WORK / "graphile-stamps"),
    DJANGO_SETTINGS_MODULE="bench.settings",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()

    from bench.suite import _create_database

    _create_database("postgresql", f"{PREFIX}_intents")
    _create_database("postgresql", f"{PREFIX}_graphile")
    graphile_url = _url(f"{PREFIX}_graphile")
    install()
    node(["migrate"], graphile_url)
    Path(os.environ["BENCH_STAMPS"]).mkdir(parents=True, exist_ok=True)

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    runs: list[dict[str, Any]] = []
    for number in range(args.rounds):
        order = CONFIGS[number % 3 :] + CONFIGS[: number % 3]
        for config in order:
            seconds = drain(config, args.n, args.workers, graphile_url)
            runs.append({"round": number + 1, "config": config, "seconds": seconds})
            print(f"round {number + 1}: {config:17} {args.n / seconds:9,.0f} jobs/s", flush=True)
    print(f"\n{args.n:,} no-op jobs, one process, {args.workers} concurrent, whole process:")
    for config in CONFIGS:
        rates = [args.n / run["seconds"] for run in runs if run["config"] == config]
        print(
            f"  {config:17} median {statistics.median(rates):9,.0f} jobs/s  "
            f"(runs: {', '.join(f'{r:,.0f}' for r in rates)})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.n, "workers": args.workers, "runs": runs}))
    return 0


def drain(config: str, n: int, workers: int, graphile_url: str) -> float:
    """Fill, then time one process draining ``n`` jobs; fail unless every job is done."""
    if config == "intents":
        argv = [sys.executable, "-m", "django", "run_intent_workers", "--drain"]
        argv += ["--workers", str(workers), "--kinds", "bench.noop", "-v", "0"]
        fill_intents(n)
        env, done = os.environ, intents_left
    else:
        mode = "batched" if config.endswith("batched") else "plain"
        argv = ["node", str(NODE / "drain.js"), str(workers), mode]
        fill_graphile(graphile_url, n)
        env, done = (
            {**os.environ, "DATABASE_URL": graphile_url},
            lambda: graphile_left(graphile_url),
        )
    began = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, check=True)
    seconds = time.perf_counter() - began
    left = done()
    if left:
        raise RuntimeError(f"{config}: {left} of {n} jobs left after the drain")
    return seconds


# -- django-intents ------------------------------------------------------------------------


def fill_intents(n: int) -> None:
    from django.db import connection

    from django_intents.models import Intent

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Intent._meta.db_table}")
    for start in range(0, n, 500):
        Intent.objects.enqueue_many(
            {"kind": "bench.noop", "event_id": f"noop-{i}", "target": "bench", "payload": {}}
            for i in range(start, min(start + 500, n))
        )


def intents_left() -> int:
    from django_intents.models import Intent

    return Intent.objects.exclude(state="completed").count()


# -- graphile-worker ------------------------------------------------------------------------


def install() -> None:
    """npm install graphile-worker, as pinned, next to a copy of ``drain.js``."""
    NODE.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "drain.js"):
        shutil.copy(ROOT / "bench" / "graphile" / name, NODE / name)
    if not (NODE / "node_modules" / "graphile-worker").is_dir():
        npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel", "error"]
        subprocess.run(npm, cwd=NODE, check=True)


def node(args: list[str], url: str) -> None:
    subprocess.run(
        ["node", str(NODE / "drain.js"), *args], env={**os.environ, "DATABASE_URL": url}, check=True
    )


def fill_graphile(url: str, n: int) -> None:
    """Empty its tables, then add ``n`` jobs through its SQL API (``add_job``)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE graphile_worker._private_jobs, graphile_worker._private_job_queues")
        for start in range(0, n, 5000):
            conn.execute(
                "SELECT count(graphile_worker.add_job('noop', json_build_object('n', n))) "
                "FROM generate_series(%s::int, %s::int) AS n",
                [start, min(start + 5000, n) - 1],
            )


def graphile_left(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM graphile_worker.jobs").fetchone()
    return int(row[0]) if row else 0


def _url(name: str) -> str:
    host = os.environ.get("PGHOST", "127.0.0.1")
    port = os.environ.get("PGPORT", "5432")
    user = os.environ.get("PGUSER", "postgres")
    return f"postgres://{user}@{host}:{port}/{name}"


if __name__ == "__main__":
    sys.exit(main())
