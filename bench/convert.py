"""Migration 0018 on a table of millions of rows: how long it holds the queue up.

    .venv/bin/python -m bench.convert [--history 5000000] [--pending 20000] [--json out.json]

Issue 38 asks that today's table (migrations to 0017) holding 5,000,000 rows
be converted to the new layout without blocking enqueue or claims for more
than a second at a time. Here a database migrated to 0017 is filled by the
server (``bench/history.py``'s finished intents over 30 days, and
``--pending`` due ones); then, while a probe connection sends every 10 ms
what the queue sends (an insert of a pending intent, and a claim of ten due
ones with ``FOR UPDATE SKIP LOCKED``, rolled back), two things run in
processes of their own, each timed:

- ``manage.py migrate django_intents 0018``: the column, the checks and
  their validation, the swap that makes the table the live partition of a
  partitioned one (docs/deployment.md, "Storage on PostgreSQL");
- the move of every finished intent out of the live partition into its
  day's, as the pools make it every second (``maintenance/retention.py``,
  ``move_finished``), batch after batch until none is left.

The report gives each phase's duration (a process's start included) and
the probes under way during it: the slowest is how long the phase held the
queue up. Every row is counted before and after (none lost, none twice)
and every moved id has its key.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import graphile_compare as graphile  # noqa: E402 - it sets its own environment
from bench import history, mvcc  # noqa: E402

PREFIX = "convert"
TABLE = "django_intents_intent"
LIVE = "django_intents_live"


class Probe(threading.Thread):
    """What the queue sends, every 10 ms: an insert and a claim; each one's time kept."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (began, seconds)
        self.stopping = threading.Event()
        self.number = 0

    def run(self) -> None:
        with mvcc.connect(self.url) as conn:
            while not self.stopping.is_set():
                self.number += 1
                began = time.perf_counter()
                conn.execute(
                    f"INSERT INTO {TABLE} (id, kind, event_id, target, payload, state, attempts, "
                    "snoozes, written_off, priority, next_at, created_at, updated_at, "
                    "last_error, last_traceback, claim_token, claim_until, trace_context) "
                    "VALUES (md5('probe' || %(n)s::text), 'bench.noop', 'probe-' || %(n)s::text, "
                    "'t', '{}', 'pending', 0, 0, 0, 0, now(), now(), now(), '', '', '', NULL, '')",
                    {"n": self.number},
                )
                # Today's table, then the live partition, as the claims name it.
                live = conn.execute("SELECT to_regclass(%s)", [LIVE]).fetchone()[0]
                with conn.transaction(force_rollback=True):
                    conn.execute(
                        f"SELECT id FROM {LIVE if live else TABLE} "
                        "WHERE (state = 'pending' OR state = 'running') "
                        "AND next_at <= now() ORDER BY next_at, created_at, id LIMIT 10 "
                        "FOR UPDATE SKIP LOCKED"
                    ).fetchall()
                self.samples.append((began, time.perf_counter() - began))
                time.sleep(0.01)

    def during(self, since: float, until: float) -> list[float]:
        """The probes under way at any moment in [since, until], slowest last."""
        return sorted(s for b, s in self.samples if b <= until and b + s >= since)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    if args.history < 1 or args.pending < 0:
        parser.error("--history must be 1 or more, --pending 0 or more")

    from bench.suite import _create_database

    name = f"{PREFIX}_intents"
    url = graphile._url(name)
    with mvcc.connect(graphile._url("postgres")) as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _create_database("postgresql", name)
    history.run_django(PREFIX, ["-m", "django", "migrate", "django_intents", "0017", "-v", "0"])
    began = time.monotonic()
    history.fill(url, args.history)
    with mvcc.connect(url) as conn:
        conn.execute(  # live intents, due, beside the history
            f"INSERT INTO {TABLE} SELECT md5('live' || g), 'bench.noop', 'live-' || g, 't', "
            "'{}', 'pending', 0, now(), now(), now(), '', '', NULL, 0, 0, '', '', 0 "
            "FROM generate_series(1, %s) AS g",
            [args.pending],
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        before = count(conn)
    print(
        f"stored {args.history:,} finished and {args.pending:,} pending intents in "
        f"{time.monotonic() - began:.0f} s",
        flush=True,
    )

    probe = Probe(url)
    probe.start()
    time.sleep(1)
    report: dict[str, Any] = {"args": vars(args), "phases": {}}
    for phase, argv in (
        ("migrate", ["-m", "django", "migrate", "django_intents", "0018", "-v", "0"]),
        ("move", ["-c", history.MOVE_ALL]),
    ):
        t0 = time.perf_counter()
        history.run_django(PREFIX, argv)
        t1 = time.perf_counter()
        time.sleep(0.05)  # the probe under way at the end finishes
        times = probe.during(t0, t1) or [0.0]
        report["phases"][phase] = figures = {
            "seconds": t1 - t0,
            "probes": len(times),
            "probe_p99_ms": 1000 * times[int(len(times) * 0.99)],
            "worst_probe_ms": 1000 * times[-1],
        }
        print(
            f"{phase:8} {figures['seconds']:8.3f} s   probes during it: p99 "
            f"{figures['probe_p99_ms']:7.1f} ms, slowest {figures['worst_probe_ms']:7.1f} ms",
            flush=True,
        )
    probe.stopping.set()
    probe.join()
    with mvcc.connect(url) as conn:
        after = count(conn)
        left = conn.execute(
            f"SELECT count(*) FROM {LIVE} WHERE state = 'completed' OR state = 'cancelled'"
        ).fetchone()[0]
        keyless = conn.execute(
            f"SELECT count(*) FROM {TABLE} AS t WHERE part <> 0 AND NOT EXISTS "
            "(SELECT 1 FROM django_intents_key AS k WHERE k.id = t.id)"
        ).fetchone()[0]
        days = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass", [TABLE]
        ).fetchone()[0]
    expected = {**before, "pending": before["pending"] + probe.number}
    if after != expected or left or keyless:
        raise RuntimeError(
            f"rows before {before} (+{probe.number} probes), after {after}; "
            f"{left} finished left in the live partition, {keyless} moved without a key"
        )
    report["partitions"] = days
    report["probes"] = {
        "sent": probe.number,
        "p50_ms": 1000 * statistics.median(s for _, s in probe.samples),
        "max_ms": 1000 * max(s for _, s in probe.samples),
    }
    report["rows"] = after
    report["move_rows_per_s"] = args.history / report["phases"]["move"]["seconds"]
    print(f"probes: {report['probes']}; partitions: {days}; rows after: {after}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def count(conn: Any) -> dict[str, int]:
    rows = conn.execute(f"SELECT state, count(*), count(DISTINCT id) FROM {TABLE} GROUP BY 1")
    counted = {}
    for state, number, distinct in rows.fetchall():
        if number != distinct:
            raise RuntimeError(f"{number - distinct} {state} ids stored twice")
        counted[state] = number
    return counted


if __name__ == "__main__":
    sys.exit(main())
