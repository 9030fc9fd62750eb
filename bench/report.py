"""The report of ``bench/run.py``: ratios against the peers, and the Markdown tables.

Apart from ``bench/run.py``, which runs the suites, so that each module stays
short enough to read whole; ``run.main`` calls :func:`ratios` and
:func:`render` once every suite has written its figures.
"""

from __future__ import annotations

from typing import Any

from bench import io_report, processes_report, relay_report
from bench.io_report import LABELS

PEERS = ("tasks_db", "ox", "procrastinate")


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


def ratios(report: dict[str, Any]) -> dict[str, Any]:
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
            if entry:  # a run of workloads with no ratio (relay alone) leaves none
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

    rows = processes_report.rows(results)
    if rows:
        parts.append(_table(processes_report.title(report), processes_report.HEADER, rows))

    rows = relay_report.rows(results)
    if rows:
        parts.append(_table(relay_report.title(report), relay_report.HEADER, rows))

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
