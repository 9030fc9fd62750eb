"""The processes workload's part of the report: one row per number of processes."""

from __future__ import annotations

from typing import Any

from bench.io_report import _n

HEADER = ["db", "processes", "workers", "jobs", "jobs/s", "vs 1 process", "executions"]
HEADER += ["duplicates", "never ran", "shares %", "worker CPU ms/job", "load"]


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in results:
        runs = r.get("processes", [])
        one = next((v["per_s"] for v in runs if v["processes"] == 1), None)
        for v in runs:
            shares = " / ".join(f"{share * 100:.0f}" for share in v["shares"])
            out.append(
                [r["db"], str(v["processes"]), str(v["workers"]), _n(v["n"]), _n(v["per_s"])]
                + [f"{v['per_s'] / one:.2f}×" if one else "–", _n(v["executions"])]
                + [_n(v["duplicates"]), _n(v["never_ran"]), shares]
                + [_n(v["cpu_s"] / v["n"] * 1000, 3), f"{v['load']:.2f}"]
            )
    return out


def title(report: dict[str, Any]) -> str:
    return (
        "Processes: one queue drained by several run_intent_workers processes of "
        f"{report['meta']['sizes']['process_workers']} workers (jobs/s = first job started to "
        "last finished; executions and duplicates counted by the jobs themselves, outside "
        "the database; shares = each process's part of the executions)"
    )
