"""The processes workload: 1, 2, 4 and 8 worker processes of 4 workers on one database.

Users outgrow one worker process long before they outgrow the database, and
run several, on one host or many. This measures the drain as processes are
added (jobs per second from the first job started to the last one finished)
and proves that no job runs twice without a fault: each job writes a line per
execution (``probe.stamp``: key, time, pid) to its process's own file, outside
the database, so a second execution shows as a key seen twice whatever the
rows say. It also says how the work was shared between the processes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .systems import MANAGE

if TYPE_CHECKING:
    from .suite import Suite


def processes(suite: Suite, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    n, per = sizes["processes_n"], sizes["process_workers"]
    argv = [*MANAGE, "run_intent_workers", "--workers", str(per), "-v", "0"]
    argv += ["--drain", "--kinds", "bench.stamp"]
    results = []
    for count in sizes["process_counts"]:
        suite.reset()
        _fill(n)
        load = os.getloadavg()[0]
        with suite.cpu() as used:
            procs = suite.start([argv] * count)
            for proc in procs:
                if proc.wait(sizes["processes_timeout"]) != 0:
                    raise RuntimeError(f"a worker process exited {proc.returncode}")
        runs = _executions(suite.stamps)
        done, last = suite.system.finished()
        keys = Counter(key for key, _, _ in runs)
        first = min(at for _, at, _ in runs)
        shares = Counter(pid for _, _, pid in runs)
        results.append(
            {
                "processes": count,
                "workers": per,
                "n": n,
                "done": done,
                "seconds": (last or first) - first,
                "per_s": done / ((last or first) - first),
                "executions": len(runs),
                "duplicates": len(runs) - len(keys),
                "never_ran": n - len(keys),
                "shares": sorted((c / len(runs) for c in shares.values()), reverse=True),
                "cpu_s": used["cpu"],
                "load": load,
            }
        )
    return results


def _fill(n: int) -> None:
    from django_intents.models import Intent

    for start in range(0, n, 500):
        Intent.objects.enqueue_many(
            {"kind": "bench.stamp", "event_id": f"p-{i}", "target": "bench", "payload": {}}
            for i in range(start, min(start + 500, n))
        )


def _executions(directory: Path) -> list[tuple[str, float, int]]:
    runs = []
    for path in directory.glob("stamps-*"):
        for line in path.read_text().splitlines():
            key, at, pid = line.split()
            runs.append((key, float(at), int(pid)))
    return runs
