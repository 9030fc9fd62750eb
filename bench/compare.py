"""Compare two checkouts of django-intents on the same machine, interleaved.

    python bench/compare.py --before ../before --after . [--rounds 3]
                            [--db sqlite,postgresql,mysql] [--workloads enqueue,drain]

Each round runs ``bench/run.py --peers none`` from the ``before`` tree, then
from the ``after`` tree (with ``--package-only``, the ``after`` tree's bench
both times, on the ``before`` tree's package through ``BENCH_CODE``: for a
``before`` whose bench lacks an option, such as ``--drain-n``), so that a
drift of the machine (another process, the page cache, autovacuum) lands on
both sides alike. Prints the median of every
figure per side and the change. A refactoring that claims "behaviour and speed
unchanged" shows it here (docs/benchmarks.md); make the ``before`` tree with
``git worktree add --detach ../before <commit>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def figures(report: dict[str, Any]) -> dict[tuple[str, str], float]:
    """``(db, figure) -> jobs per second`` from one ``bench/run.py --json`` report."""
    found: dict[tuple[str, str], float] = {}
    for result in report["results"]:
        db = result["db"]
        if "error" in result:
            raise RuntimeError(f"{db}: {result['error']}")
        for figure in result.get("enqueue", {}).values():
            found[(db, f"enqueue {figure['api']}")] = figure["per_s"]
        for drain in result.get("drain", []):
            found[(db, f"drain {drain['workers']} w")] = drain["per_s"]
        for row in result.get("io", []):
            if "per_s" in row:  # a variant that broke has no figure to compare
                found[(db, f"io {row['variant']}")] = row["per_s"]
    return found


def run(tree: Path, args: argparse.Namespace) -> dict[tuple[str, str], float]:
    env = dict(os.environ)
    if args.package_only:
        if tree != args.after.resolve():
            env["BENCH_CODE"] = str(tree)
        tree = args.after.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [
            sys.executable,
            str(tree / "bench" / "run.py"),
            "--peers",
            "none",
            "--db",
            args.db,
            "--workloads",
            args.workloads,
            "--json",
            str(out),
            *(["--drain-n", str(args.drain_n)] if args.drain_n else []),
            *(["--drain-workers", args.drain_workers] if args.drain_workers else []),
        ]
        code = env.get("BENCH_CODE", tree)
        print(f"-- {code} (bench of {tree}): {' '.join(command[2:])}", file=sys.stderr, flush=True)
        subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        return figures(json.loads(out.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--after", type=Path, default=Path("."), help="the tree with the change")
    parser.add_argument("--rounds", type=int, default=3, help="before/after pairs (default 3)")
    parser.add_argument("--db", default="sqlite,postgresql,mysql")
    parser.add_argument("--workloads", default="enqueue,drain")
    parser.add_argument("--json", type=Path, help="write every run's figures to this file")
    parser.add_argument("--drain-n", type=int, help="intents per drain (bench/run.py's default)")
    parser.add_argument("--drain-workers", help="the drain's --workers, comma-separated")
    parser.add_argument(
        "--package-only",
        action="store_true",
        help="run the after tree's bench both times; only the package differs (BENCH_CODE)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    sides: dict[str, list[dict[tuple[str, str], float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for side in ("before", "after"):
            sides[side].append(run(getattr(args, side).resolve(), args))
    keys = sorted({key for runs in sides.values() for run_ in runs for key in run_})
    print(f"| db | figure (jobs/s) | before (median of {args.rounds}) | after | change |")
    print("|---|---|---|---|---|")
    for key in keys:
        before = statistics.median(r[key] for r in sides["before"] if key in r)
        after = statistics.median(r[key] for r in sides["after"] if key in r)
        change = (after / before - 1) * 100
        print(f"| {key[0]} | {key[1]} | {before:,.0f} | {after:,.0f} | {change:+.1f} % |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    side: [{" / ".join(k): v for k, v in r.items()} for r in runs]
                    for side, runs in sides.items()
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
