"""``bench/run.py --quick`` runs end to end and reports every figure.

Only the shape of the report is checked, never a speed: CI machines differ,
and docs/benchmarks.md is where the figures of a real run are published.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the quick bench runs on SQLite whatever the suite's database: in the SQLite run",
)
def test_quick_benchmark_on_sqlite_reports_every_workload(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "BENCH_WORK": str(tmp_path / "work")}
    env.pop("BENCH_CODE", None)
    done = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--db", "sqlite", "--peers", "none"]
        + ["--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for title in ("Enqueue", "Drain", "Latency", "Large table", "Crash cost", "IO", "Processes"):
        assert f"### {title}" in done.stdout

    report = json.loads(out.read_text())
    assert report["meta"]["quick"] is True
    assert positive(report["meta"]["cores"])
    [result] = report["results"]
    assert (result["system"], result["db"]) == ("intents", "sqlite")

    enqueue = result["enqueue"]
    assert positive(enqueue["one"]["per_s"]) and positive(enqueue["many"]["per_s"])
    assert [row["workers"] for row in result["drain"]] == [1, 4, 8]
    for row in result["drain"]:
        assert positive(row["per_s"]) and positive(row["seconds"]) and positive(row["cpu_s"])
        assert row["n"] == report["meta"]["sizes"]["drain"]
    assert positive(result["startup_cpu_s"])

    latency = result["latency"]
    assert positive(latency["p50_ms"]) and latency["p99_ms"] >= latency["p50_ms"]
    assert latency["n"] == report["meta"]["sizes"]["latency"]

    large = result["large"]
    assert positive(large["per_s"]) and positive(large["churned"])

    [crash] = result["crash"]
    assert positive(crash["lease_s"]) and positive(crash["seconds"])

    # Several processes on one queue: every job ran exactly once, shared out.
    sizes = report["meta"]["sizes"]
    assert [row["processes"] for row in result["processes"]] == sizes["process_counts"]
    for row in result["processes"]:
        assert (row["done"], row["executions"]) == (sizes["processes_n"], sizes["processes_n"])
        assert (row["duplicates"], row["never_ran"]) == (0, 0)
        assert positive(row["per_s"]) and sum(row["shares"]) == pytest.approx(1)

    # The io workload: the timer variants always run (the HTTP ones only where
    # the bench group installed aiohttp and urllib3); every job ends where its
    # variant says, succeeding or failing.
    io = {row["variant"]: row for row in result["io"]}
    assert {"time.sleep", "asyncio.sleep", "time.sleep, fails", "asyncio.sleep, fails"} <= set(io)
    for row in io.values():
        assert "error" not in row, row
        assert row["n"] == report["meta"]["sizes"]["io"]
        assert row["wrong"] == 0 and row["left"] == 0, row
        assert positive(row["per_s"]) and positive(row["cpu_s"]) and positive(row["rss_mb"])
