"""The relay workload's part of the report: one row per (system, scenario).

Apart from ``bench/report.py`` so that each module stays readable on its own;
``report.render`` calls these.
"""

from __future__ import annotations

from typing import Any

from bench.io_report import LABELS, _n

HEADER = ["db", "system", "scenario", "setting", "jobs", "healthy/s", "all/s", "in flight"]
HEADER += ["p50 s", "p99 s"]
HEADER += ["healthy peak", "dead peak", "limited req", "429s", "% above", "lost to 429"]
HEADER += ["peak conns", "worker CPU s", "exit", "load"]


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """One row per scenario; one that broke says why."""
    out = []
    for r in results:
        for v in r.get("relay", []):
            cells = [r["db"], LABELS[r["system"]], v["scenario"]]
            if "per_s" not in v:
                out.append([*cells, v.get("setting", ""), "error: " + v["error"][:120]])
                out[-1] += [""] * (len(HEADER) - len(out[-1]))
                continue
            rate = _n(v["per_s"]) + ("*" if v.get("timed_out") else "")
            outage = "dead_peak" in v
            out.append(
                [*cells, v["setting"], _n(v["n"]), rate, _n(v.get("all_per_s"))]
                + [_n(v.get("healthy_in_flight"), 1)]
                + [_n(v["p50_s"], 1), _n(v["p99_s"], 1)]
                + [_n(v.get("healthy_peak")), _n(v.get("dead_peak")), _n(v.get("limited_requests"))]
                + [_n(v.get("limited_429")), _n(v.get("limited_above_pct"), 1) if outage else "–"]
                + [_n(v.get("limited_lost")), _n(v["peak_connections"]), _n(v["cpu_s"], 1)]
                + [str(v["exit"]), f"{v['load']:.2f}"]
            )
    return out


def title(report: dict[str, Any]) -> str:
    sizes = report["meta"]["sizes"]
    return (
        f"Relay: {sizes['relay']:,} deliveries over 20 targets, one worker process, "
        f"{sizes['relay_in_flight']} in flight (healthy/s = deliveries to "
        "targets 2–19, healthy in every scenario, ÷ first request to their last delivery; "
        "all/s = every target's deliveries, healthy scenarios only; in flight = the healthy "
        "targets' requests in flight on average over that time; p50/p99 enqueue to "
        "delivery of healthy targets; healthy peak = most requests one healthy target had "
        "in flight at once; dead peak = most requests the dead target held at once; "
        "% above = 429s ÷ the limited target's "
        "requests; * stopped at the time limit)"
    )
