"""Benchmark django-intents against its peers, on every database, in one run.

    python bench/run.py [--quick] [--db sqlite,postgresql,mysql]
                        [--peers tasks_db,ox,procrastinate|none] [--json out.json]

Workloads (docs/benchmarks.md says what each measures and why):

- enqueue: one job per transaction, and the batch API in batches of 500;
- drain: N no-op jobs run by ``--drain`` workers at 1, 4 and 8 workers,
  jobs per second from the first job started to the last one finished, and
  worker CPU per job (``getrusage(RUSAGE_CHILDREN)``, less start-up);
- latency: an idle pool of 4; 200 jobs enqueued 20 ms apart; commit to
  handler start, p50 and p99;
- large table: the 4-worker drain with 500,000 churned finished rows present;
- crash: SIGKILL a worker mid-job, time until another worker starts it
  (django-intents only; default and short lease);
- io: jobs that wait 100 ms (sync and async, a timer and a real local HTTP
  server), then the same with every call failing; jobs/s, peak server
  connections, worker CPU and RSS, and a check of every job's final state
  (``bench/io_workload.py``);
- relay: 20,000 deliveries to 20 partners, all healthy, then with one dead and
  one rate-limited, without and with a per-target limit; healthy deliveries/s,
  enqueue-to-delivery p50/p99, what the bad partners saw
  (``bench/relay_workload.py``);
- processes: 20,000 jobs drained by 1, 2, 4 and 8 worker processes of 4
  workers each (django-intents only): jobs/s, executions counted by the jobs
  themselves (duplicates, none expected without faults) and each process's
  share (``bench/processes_workload.py``);
- ceiling: pgbench, one-row UPDATE per transaction, on the same PostgreSQL.

Each (system, database) pair runs in its own process (``bench/suite.py``) with
its own database, ``bench_<system>``. Peers run when their package is
installed: ``pip install -e . --group bench`` (the ``bench`` dependency group of
pyproject.toml, pip 25.1+; Python 3.12+, Django 6).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from glob import glob
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import LABELS, PEERS, ratios, render  # noqa: E402
from bench.suite import _pythonpath  # noqa: E402
from bench.systems import PACKAGES  # noqa: E402

WORK = Path(os.environ.get("BENCH_WORK", ROOT / ".tmp" / "bench"))
DBS = ("sqlite", "postgresql", "mysql")
PEER_VENDORS = {"tasks_db": DBS, "ox": DBS, "procrastinate": ("postgresql",)}
FULL = {
    "enqueue_one": 2000,
    "enqueue_many": 20000,
    "drain": 2000,
    "workers": [1, 4, 8],
    "latency": 200,
    "gap": 0.02,
    "latency_workers": 4,
    "large_workers": 4,
    "churned": 500_000,
    "leases": [None, 2.0],
    "pgbench_seconds": 5,
    "large_timeout": 20,
    "io": 20000,
    "io_delay": 0.1,
    "io_workers": 1024,
    "io_concurrency": 1000,
    "io_tasks_db": 2000,
    "io_procrastinate": 5000,
    "io_tasks_db_processes": 16,
    "io_timeout": 120,
    "relay": 20000,
    "relay_in_flight": 64,
    "relay_procrastinate": 5000,
    "relay_tasks_db": 2000,
    "relay_tasks_db_processes": 16,
    "relay_timeout": 240,
    "processes_n": 20000,
    "process_counts": [1, 2, 4, 8],
    "process_workers": 4,
    "processes_timeout": 300,
}
QUICK = {
    **FULL,
    "enqueue_one": 100,
    "enqueue_many": 1000,
    "drain": 200,
    "latency": 20,
    "churned": 2000,
    "leases": [1.0],
    "pgbench_seconds": 2,
    "large_timeout": 30,
    "io": 300,
    "io_workers": 50,
    "io_concurrency": 50,
    "io_tasks_db": 100,
    "io_procrastinate": 300,
    "io_tasks_db_processes": 4,
    "io_timeout": 60,
    "relay": 400,
    "relay_procrastinate": 400,
    "relay_tasks_db": 400,
    "relay_tasks_db_processes": 4,
    "relay_timeout": 60,
    "processes_n": 300,
    "process_counts": [1, 2],
}
WORKLOADS = ["enqueue", "drain", "latency", "large", "crash", "io", "relay", "processes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--db", default="sqlite,postgresql,mysql", help="databases to run on")
    parser.add_argument(
        "--peers", default="tasks_db,ox,procrastinate", help="peers to run (or 'none')"
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="subset of " + ",".join(WORKLOADS)
    )
    parser.add_argument(
        "--large-db",
        help="databases the large-table workload runs on (default: postgresql, where "
        "dead rows stay until VACUUM, since churning 500,000 rows per system elsewhere "
        "adds minutes; with --quick, every database)",
    )
    parser.add_argument(
        "--io-db",
        help="databases the io workload runs on (default: postgresql, where the targets "
        "are set; with --quick, every database)",
    )
    parser.add_argument(
        "--io-variants",
        help="io rows to run, separated by ';', named as the table names them "
        "(time.sleep, asyncio.sleep, urllib3, aiohttp; ', fails' for the failing "
        "row); default all",
    )
    parser.add_argument(
        "--relay-db",
        default="postgresql",
        help="databases the relay workload runs on (default: postgresql, even with --quick: "
        "it needs aiohttp, which the test venvs lack)",
    )
    parser.add_argument(
        "--processes-db",
        help="databases the processes workload runs on (default: postgresql; with --quick, "
        "every database)",
    )
    parser.add_argument("--drain-n", type=int, help="intents per drain (default 2,000)")
    parser.add_argument(
        "--drain-workers", help="comma-separated --workers of the drain (default 1,4,8)"
    )
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args()
    dbs = [db for db in args.db.split(",") if db]
    for db in dbs:
        if db not in DBS:
            parser.error(f"unknown database {db!r}; choose from {', '.join(DBS)}")
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    for peer in peers:
        if peer not in PEERS:
            parser.error(f"unknown peer {peer!r}; choose from {', '.join(PEERS)} or none")
    large_default = dbs if args.quick else ["postgresql"]
    sizes = {
        **(QUICK if args.quick else FULL),
        "workloads": args.workloads.split(","),
        "large_dbs": args.large_db.split(",") if args.large_db else large_default,
        "io_dbs": args.io_db.split(",") if args.io_db else large_default,
        "io_variants": _io_variants(parser, args.io_variants),
        "relay_dbs": args.relay_db.split(","),
        "processes_dbs": args.processes_db.split(",") if args.processes_db else large_default,
    }
    if args.drain_n:
        sizes["drain"] = args.drain_n
    if args.drain_workers:
        sizes["workers"] = [int(w) for w in args.drain_workers.split(",")]
    missing = [p for p in peers if not _installed(p)]
    peers = [p for p in peers if p not in missing]

    began = time.time()
    report: dict[str, Any] = {
        "meta": _meta(args, sizes, missing),
        "results": [],
    }
    if missing:
        print(f"peers not installed, skipped: {', '.join(missing)}", file=sys.stderr)
    for db in dbs:
        for system in ["intents", *peers]:
            if system != "intents" and db not in PEER_VENDORS[system]:
                continue
            print(f"-- {LABELS[system]} on {db}", file=sys.stderr, flush=True)
            report["results"].append(_run_suite(system, db, sizes))
    if "postgresql" in dbs and "drain" in sizes["workloads"]:  # the drain is what it bounds
        report["ceiling"] = _pgbench(sizes["pgbench_seconds"])
    report["meta"]["seconds"] = time.time() - began
    report["meta"]["load_after"] = os.getloadavg()
    report["ratios"] = ratios(report)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _io_variants(parser: argparse.ArgumentParser, given: str | None) -> list[str] | None:
    """The io rows asked for: names separated by ';', each checked against the table's."""
    if given is None:
        return None
    from bench.io_systems import VARIANTS

    known = [v.name for v in VARIANTS]
    names = [name.strip() for name in given.split(";") if name.strip()]
    for name in names:
        if name not in known:
            parser.error(f"unknown io variant {name!r}; choose from {'; '.join(known)}")
    return names


def _installed(peer: str) -> bool:
    if find_spec(PACKAGES[peer]) is None:
        return False
    if peer == "procrastinate":
        return find_spec("procrastinate.contrib.django") is not None
    return find_spec("django.tasks") is not None or find_spec("django_tasks") is not None


def _meta(args: argparse.Namespace, sizes: dict[str, Any], missing: list[str]) -> dict[str, Any]:
    import django

    versions = {"python": platform.python_version(), "django": django.__version__}
    for name in ("django-intents", "django-tasks-db", "django-ox", "procrastinate"):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:  # noqa: S112 - not installed is fine
            continue
    return {
        "command": " ".join(["python", "bench/run.py", *sys.argv[1:]]),
        "quick": args.quick,
        "sizes": sizes,
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "versions": versions,
        "servers": _server_versions(args.db.split(",")),
        "peers_missing": missing,
        "code": os.environ.get("BENCH_CODE") or "working tree",
    }


def _server_versions(dbs: list[str]) -> dict[str, str]:
    import sqlite3

    found = {"sqlite": sqlite3.sqlite_version}
    commands = {
        "postgresql": ["psql", "-h", "127.0.0.1", "-U", "postgres", "-tAc", "SHOW server_version"],
        "mysql": ["mysql", "-h127.0.0.1", "-uroot", "-N", "-e", "SELECT VERSION()"],
    }
    for db, command in commands.items():
        if db in dbs and shutil.which(command[0]):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            found[db] = done.stdout.strip()
    return found


def _run_suite(system: str, db: str, sizes: dict[str, Any]) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {
            **os.environ,
            "BENCH_DB": db,
            "BENCH_SYSTEM": system,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PYTHONPATH": _pythonpath(),
            "BENCH_WORK": str(WORK),
        }
        done = subprocess.run(
            [sys.executable, "-m", "bench.suite", json.dumps(sizes), str(out)],
            cwd=WORK,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            return {"system": system, "db": db, "error": f"exit status {done.returncode}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _pgbench(seconds: int) -> dict[str, Any]:
    """One-row UPDATE per transaction: what this PostgreSQL can commit per second."""
    binary = shutil.which("pgbench") or next(
        iter(sorted(glob("/usr/lib/postgresql/*/bin/pgbench"))), None
    )
    if binary is None:
        return {"error": "pgbench not found"}
    conn = ["-h", os.environ.get("PGHOST", "127.0.0.1"), "-p", os.environ.get("PGPORT", "5432")]
    conn += ["-U", os.environ.get("PGUSER", "postgres")]
    subprocess.run(
        ["psql", *conn, "-d", "postgres", "-qc", "CREATE DATABASE bench_ceiling"],
        capture_output=True,
        check=False,
    )
    subprocess.run(
        [binary, *conn, "-i", "-q", "-s", "1", "bench_ceiling"], capture_output=True, check=True
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(
            "\\set aid random(1, 100000)\n"
            "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
        )
    results = {}
    try:
        for clients in (1, 4, 8):
            done = subprocess.run(
                [binary, *conn, "-n", "-f", script.name, "-c", str(clients), "-j", "2"]
                + ["-T", str(seconds), "bench_ceiling"],
                capture_output=True,
                text=True,
                check=True,
            )
            match = re.search(r"tps = ([0-9.]+)", done.stdout)
            results[str(clients)] = float(match.group(1)) if match else None
    finally:
        os.unlink(script.name)
    return {"seconds": seconds, "tps": results}


if __name__ == "__main__":
    sys.exit(main())
