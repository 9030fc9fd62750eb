"""The io workload's part of the report: its table and its ratios against the peers.

Apart from ``bench/report.py`` so that each module stays readable on its own;
``report.render`` and ``report.ratios`` call these.
"""

from __future__ import annotations

from typing import Any

LABELS = {
    "intents": "django-intents",
    "tasks_db": "django-tasks-db",
    "ox": "django-ox",
    "procrastinate": "Procrastinate",
}
HEADER = ["db", "system", "handler", "setting", "jobs", "jobs/s", "peak conns"]
HEADER += ["worker CPU s", "RSS MB", "wrong", "left", "exit", "server CPU s", "load"]


def _n(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """One row per (database, system, variant); a variant that broke says why."""
    out = []
    for r in results:
        for v in r.get("io", []):
            cells = [r["db"], LABELS[r["system"]], v["variant"]]
            if "per_s" not in v:
                out.append([*cells, v.get("setting", ""), "error: " + v["error"][:120]] + [""] * 9)
                continue
            rate = _n(v["per_s"]) + ("*" if v.get("timed_out") else "")
            if "error" in v:
                rate += " (!)"
            rss = _n(v["rss_mb"])
            if v["processes"] > 1:
                rss += f" (×{v['processes']}: {_n(v['rss_total_mb'])})"
            out.append(
                [*cells, v["setting"], _n(v["n"]), rate, _n(v["peak_connections"])]
                + [_n(v["cpu_s"], 1), rss, _n(v["wrong"]), _n(v["left"]), str(v["exit"])]
                + [_n(v.get("server_cpu_s"), 1), f"{v['load']:.2f}"]
            )
    return out


def title(report: dict[str, Any]) -> str:
    sizes = report["meta"]["sizes"]
    return (
        f"IO: {sizes['io']:,} jobs waiting {sizes['io_delay'] * 1000:.0f} ms each, one worker "
        "process (jobs/s first start to last finish; peak server connections sampled every "
        "50 ms; wrong = ended in the other final state; left = not finished; "
        "* stopped at the time limit; (!) faster than its slots allow: see the JSON)"
    )


def ratios(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> dict[str, float]:
    """Our jobs/s ÷ the peer's, for each variant both ran; unequal settings are named."""
    if not ours or not theirs:
        return {}
    mine = {v["variant"]: v for v in ours.get("io", []) if "per_s" in v and "error" not in v}
    out = {}
    for v in theirs.get("io", []):
        if "per_s" in v and v["variant"] in mine:
            key = "io " + v["variant"].replace(", fails", " failing")
            if mine[v["variant"]]["setting"] != v["setting"]:
                key += f" ({mine[v['variant']]['setting']} vs {v['setting']})"
            out[key] = mine[v["variant"]]["per_s"] / v["per_s"]
    return out
