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
- ceiling: pgbench, one-row UPDATE per transaction, on the same PostgreSQL.

Each (system, database) pair runs in its own process (``bench/suite.py``) with
its own database, ``bench_<system>``. Peers run when their package is
installed: ``pip install -e '.[bench]'`` (Python 3.12+, Django 6).
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

from bench import io_report  # noqa: E402
from bench.suite import _pythonpath  # noqa: E402
from bench.systems import PACKAGES  # noqa: E402

WORK = Path(os.environ.get("BENCH_WORK", ROOT / ".tmp" / "bench"))
DBS = ("sqlite", "postgresql", "mysql")
PEERS = ("tasks_db", "ox", "procrastinate")
PEER_VENDORS = {"tasks_db": DBS, "ox": DBS, "procrastinate": ("postgresql",)}
LABELS = {
    "intents": "django-intents",
    "tasks_db": "django-tasks-db",
    "ox": "django-ox",
    "procrastinate": "Procrastinate",
}
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
}
WORKLOADS = ["enqueue", "drain", "latency", "large", "crash", "io"]


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
    }
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
    if "postgresql" in dbs:
        report["ceiling"] = _pgbench(sizes["pgbench_seconds"])
    report["meta"]["seconds"] = time.time() - began
    report["meta"]["load_after"] = os.getloadavg()
    report["ratios"] = _ratios(report)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


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


# -- report --------------------------------------------------------------------


def _find(report: dict[str, Any], system: str, db: str) -> dict[str, Any] | None:
    for result in report["results"]:
        if result["system"] == system and result["db"] == db and "error" not in result:
            return result
    return None


def _drain_rate(result: dict[str, Any] | None, workers: int) -> float | None:
    for row in (result or {}).get("drain", []):
        if row["workers"] == workers:
            return float(row["per_s"])
    return None


def _large_ratio(result: dict[str, Any] | None, vacuumed: bool = False) -> float | None:
    """Empty-table jobs/s ÷ large-table jobs/s: 1.0 means the churned rows cost nothing."""
    if not result or "large" not in result:
        return None
    large = result["large"].get("vacuumed") if vacuumed else result["large"]
    empty = _drain_rate(result, result["large"]["workers"])
    return empty / large["per_s"] if empty and large else None


def _ratios(report: dict[str, Any]) -> dict[str, Any]:
    """django-intents ÷ each peer (higher is better for us), per database and workload."""
    ratios: dict[str, Any] = {}
    dbs = sorted({r["db"] for r in report["results"]})
    for db in dbs:
        ours = _find(report, "intents", db)
        if ours is None:
            continue
        for peer in PEERS:
            theirs = _find(report, peer, db)
            if theirs is None:
                continue
            entry: dict[str, Any] = {}
            for workers in (1, 4, 8):
                a, b = _drain_rate(ours, workers), _drain_rate(theirs, workers)
                if a and b:
                    entry[f"drain_{workers}"] = a / b
            if "latency" in ours and "latency" in theirs:
                entry["latency_p50"] = theirs["latency"]["p50_ms"] / ours["latency"]["p50_ms"]
                entry["latency_p99"] = theirs["latency"]["p99_ms"] / ours["latency"]["p99_ms"]
            if "large" in ours and "large" in theirs:
                entry["large_table"] = ours["large"]["per_s"] / theirs["large"]["per_s"]
                if "vacuumed" in ours["large"] and "vacuumed" in theirs["large"]:
                    entry["large_table_vacuumed"] = (
                        ours["large"]["vacuumed"]["per_s"] / theirs["large"]["vacuumed"]["per_s"]
                    )
            if "enqueue" in ours and "enqueue" in theirs:
                entry["enqueue_one"] = (
                    ours["enqueue"]["one"]["per_s"] / theirs["enqueue"]["one"]["per_s"]
                )
                if "many" in theirs["enqueue"]:
                    entry["enqueue_many"] = (
                        ours["enqueue"]["many"]["per_s"] / theirs["enqueue"]["many"]["per_s"]
                    )
            entry.update(io_report.ratios(ours, theirs))
            ratios[f"{db}/{peer}"] = entry
        ceiling = report.get("ceiling", {}).get("tps", {})
        if db == "postgresql" and ceiling:
            for workers in (1, 4, 8):
                rate, tps = _drain_rate(ours, workers), ceiling.get(str(workers))
                if rate and tps:
                    ratios.setdefault("postgresql/pgbench", {})[f"drain_{workers}"] = rate / tps
    return ratios


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [f"\n### {title}\n", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    return "\n".join(out)


def _rate(drain: dict[str, Any]) -> str:
    """Jobs/s of a drain, starred if it was stopped at its time limit."""
    return _n(drain["per_s"]) + ("*" if drain.get("timed_out") else "")


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    """Markdown tables of every figure in ``report``."""
    results = [r for r in report["results"] if "error" not in r]
    parts = []
    meta = report["meta"]
    parts.append(
        f"`{meta['command']}` — {meta['cores']} cores, load {meta['load_before'][0]:.2f} before, "
        f"{report['meta'].get('load_after', [0])[0]:.2f} after, "
        f"{report['meta'].get('seconds', 0):.0f} s; servers {meta['servers']}"
    )
    failed = [r for r in report["results"] if "error" in r]
    for r in failed:
        parts.append(f"\n**{LABELS[r['system']]} on {r['db']} failed: {r['error']}**")

    rows = []
    for r in results:
        if "enqueue" in r:
            for key in ("one", "many"):
                if key in r["enqueue"]:
                    e = r["enqueue"][key]
                    rows.append(
                        [r["db"], LABELS[r["system"]], e["api"], _n(e["n"]), _n(e["per_s"])]
                    )
    if rows:
        parts.append(_table("Enqueue (jobs/s)", ["db", "system", "call", "jobs", "jobs/s"], rows))

    rows = []
    for r in results:
        if "drain" in r:
            by = {d["workers"]: d for d in r["drain"]}
            cells = [r["db"], LABELS[r["system"]]]
            cells += [_n(by[w]["per_s"]) if w in by else "–" for w in (1, 4, 8)]
            four = by.get(4) or r["drain"][-1]
            net = (four["cpu_s"] - r["startup_cpu_s"]) / four["n"] * 1000
            cells += [_n(four["cpu_s"] / four["n"] * 1000, 2), _n(net, 2)]
            cells += [f"{min(d['load'] for d in r['drain']):.2f}"]
            rows.append(cells)
    if rows:
        n = results[0]["drain"][0]["n"] if "drain" in results[0] else "N"
        parts.append(
            _table(
                f"Drain, {n} no-op jobs (jobs/s, first start to last finish)",
                ["db", "system", "1 worker", "4 workers", "8 workers"]
                + ["CPU ms/job (4 w)", "less start-up", "load"],
                rows,
            )
        )

    rows = []
    for r in results:
        if "latency" in r:
            lat = r["latency"]
            rows.append(
                [r["db"], LABELS[r["system"]], _n(lat["p50_ms"], 1), _n(lat["p99_ms"], 1)]
                + [_n(lat["max_ms"], 1), f"{lat['load']:.2f}"]
            )
    if rows:
        lat = next(r["latency"] for r in results if "latency" in r)
        parts.append(
            _table(
                f"Latency, idle pool of {lat['workers']}, {lat['n']} jobs {lat['gap_ms']:.0f} ms "
                "apart (ms, commit to handler start)",
                ["db", "system", "p50", "p99", "max", "load"],
                rows,
            )
        )

    rows = []
    for r in results:
        if "large" in r:
            large = r["large"]
            empty = _drain_rate(r, large["workers"])
            vacuumed = large.get("vacuumed")
            rows.append(
                [r["db"], LABELS[r["system"]], _n(large["churned"]), _n(empty), _rate(large)]
                + [_n(_large_ratio(r), 2)]
                + [_rate(vacuumed) if vacuumed else "–", _n(_large_ratio(r, True), 2)]
                + [_n(large["churn_s"], 0)]
            )
    if rows:
        workers = next(r["large"]["workers"] for r in results if "large" in r)
        rows.append(
            ["", "* stopped at the time limit; rate of the jobs finished by then"] + [""] * 7
        )
        parts.append(
            _table(
                f"Large table: {workers}-worker drain with churned finished rows present "
                "(slowdown = empty-table jobs/s ÷ large-table jobs/s)",
                ["db", "system", "rows", "empty jobs/s", "large jobs/s", "slowdown"]
                + ["after VACUUM jobs/s", "slowdown", "churn s"],
                rows,
            )
        )

    rows = []
    for r in results:
        for c in r.get("crash", []):
            rows.append([r["db"], LABELS[r["system"]], _n(c["lease_s"], 1), _n(c["seconds"], 2)])
    if rows:
        parts.append(
            _table(
                "Crash cost: SIGKILL to the job running on another worker",
                ["db", "system", "lease s", "seconds"],
                rows,
            )
        )

    rows = io_report.rows(results)
    if rows:
        parts.append(_table(io_report.title(report), io_report.HEADER, rows))

    ceiling = report.get("ceiling", {})
    if "tps" in ceiling:
        ours = _find(report, "intents", "postgresql")
        rows = [
            [
                clients,
                _n(tps),
                _n(_drain_rate(ours, int(clients))),
                _n((_drain_rate(ours, int(clients)) or 0) / tps * 100 if tps else None, 0),
            ]
            for clients, tps in ceiling["tps"].items()
        ]
        parts.append(
            _table(
                "Ceiling: pgbench one-row UPDATE per transaction vs django-intents drain",
                ["clients / workers", "pgbench tps", "drain jobs/s", "% of pgbench"],
                rows,
            )
        )

    rows = [
        [key, ", ".join(f"{k} {v:.2f}×" for k, v in entry.items())]
        for key, entry in report.get("ratios", {}).items()
    ]
    if rows:
        parts.append(
            _table("django-intents ÷ peer (above 1 = we are better)", ["pair", "ratios"], rows)
        )
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
