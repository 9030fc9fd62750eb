"""The online conversion to finished intents by day: how long each step blocks the queue.

    .venv/bin/python -m bench.convert [--history 5000000] [--pending 20000]
                                      [--batch 10000] [--json out.json]

Issue 38 asks that today's table (migrations to 0017) holding 5,000,000 rows
be converted to the new layout without blocking enqueue or claims for more
than a second at a time. The layout measured here (docs/benchmarks.md,
"Finished intents by day: the design, measured"): the table becomes a
PostgreSQL table partitioned by an integer ``part``, today's table its
partition of live intents (``part`` 0) with no row copied, finished intents
in a partition per day (``part`` the day's number), ids of moved rows in a
key table; a mover then takes the finished rows out of the live partition
in batches.

The steps, in the order an operator's migration would run them:

- ``add_column``: ``part`` with a constant default (a catalog change; no
  row is rewritten on PostgreSQL 11 and later);
- ``not_valid``: a ``CHECK`` that ``part`` is 0, not yet checked;
- ``validate``: checking it (reads the table, takes only a lock that lets
  reads and writes go on);
- ``index``: ``CREATE UNIQUE INDEX CONCURRENTLY`` on ``(id, part)``, which a
  partitioned table's unique index needs on each partition;
- ``swap``: one transaction that renames the table, creates the partitioned
  one under its name and attaches the old one as its live partition (the
  check proves its rows belong there, so nothing is scanned), with the
  indexes every partition shares (``(id, part)``, the admin's and
  retention's), the key table and its current generation;
- ``partitions``: a partition per day of the history and two ahead, one
  short transaction each;
- ``move``: the finished rows out of the live partition, ``--batch`` a
  transaction (a ``DELETE ... RETURNING`` from the live partition into the
  parent and the key table, as the completions will move rows).

A probe connection meanwhile sends, every 10 ms, what the queue sends on
both layouts: an insert of a pending row and a claim of ten due rows with
``FOR UPDATE SKIP LOCKED`` (rolled back), and records each one's time. The
report gives each step's duration and the slowest probe during it: that is
how long the step held the queue up. The probe claims from today's table,
then, after the swap, from the live partition, as the new claims will.
Every row is counted before and after:
nothing is lost or doubled.
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
FINISHED = "(state = 'completed' OR state = 'cancelled')"
# The indexes every partition shares: the admin's and retention's, by their
# definitions on today's table (migrations 0001-0017), so that the live
# partition's own attach to them.
SHARED = {
    "intents_created_idx": "(created_at, id)",
    "intents_kind_state_event_idx": "(kind, state, event_id)",
    "intents_finished_idx": f"(updated_at) WHERE {FINISHED}",
}
DAY = "floor(extract(epoch FROM {}) / 86400)::integer"
COLUMNS = (
    "id, kind, event_id, target, payload, state, attempts, next_at, created_at, updated_at, "
    "last_error, claim_token, claim_until, snoozes, priority, trace_context, last_traceback, "
    "written_off"
)

STEPS: dict[str, list[str]] = {
    "add_column": [f"ALTER TABLE {TABLE} ADD COLUMN part integer NOT NULL DEFAULT 0"],
    "not_valid": [
        f"ALTER TABLE {TABLE} ADD CONSTRAINT intents_live_part "
        "CHECK (part >= 0 AND part < 1) NOT VALID"
    ],
    "validate": [f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT intents_live_part"],
    "index": [f"CREATE UNIQUE INDEX CONCURRENTLY intents_live_id_part ON {TABLE} (id, part)"],
    "swap": [  # one transaction
        f"ALTER TABLE {TABLE} RENAME TO intents_live",
        f"CREATE TABLE {TABLE} (LIKE intents_live INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY RANGE (part)",
        f"ALTER TABLE {TABLE} DROP CONSTRAINT intents_live_part",
        f"CREATE UNIQUE INDEX intents_id_part ON ONLY {TABLE} (id, part)",
        *(f"CREATE INDEX intents_all_{n[8:]} ON ONLY {TABLE} {d}" for n, d in SHARED.items()),
        f"ALTER TABLE {TABLE} ATTACH PARTITION intents_live FOR VALUES FROM (0) TO (1)",
        "ALTER INDEX intents_id_part ATTACH PARTITION intents_live_id_part",
        *(f"ALTER INDEX intents_all_{n[8:]} ATTACH PARTITION {n}" for n in SHARED),
        "CREATE TABLE intents_key (id varchar(64) NOT NULL, at timestamptz NOT NULL) "
        "PARTITION BY RANGE (at)",
        "CREATE TABLE intents_key_now PARTITION OF intents_key (PRIMARY KEY (id)) "
        "FOR VALUES FROM (MINVALUE) TO (MAXVALUE)",
    ],
}
MOVE = f"""
WITH batch AS (
    SELECT id FROM intents_live WHERE {FINISHED} LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM intents_live AS l USING batch WHERE l.id = batch.id RETURNING l.*
), keys AS (
    INSERT INTO intents_key_now (id, at) SELECT id, now() FROM moved ON CONFLICT (id) DO NOTHING
)
INSERT INTO {TABLE} ({COLUMNS}, part) SELECT {COLUMNS}, {DAY.format("updated_at")} FROM moved
"""


class Probe(threading.Thread):
    """What the queue sends, every 10 ms: an insert and a claim; each one's time kept."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (began, seconds)
        self.stopping = threading.Event()
        self.number = 0
        # The claim's table: today's, then the live partition, which the claims
        # of the new layout name (the parent would also plan its other partitions).
        self.claims_from = TABLE

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
                with conn.transaction(force_rollback=True):
                    conn.execute(
                        f"SELECT id FROM {self.claims_from} "
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
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    if args.history < 1 or args.batch < 1 or args.pending < 0:
        parser.error("--history and --batch must be 1 or more, --pending 0 or more")

    from bench.suite import _create_database

    name = f"{PREFIX}_intents"
    url = graphile._url(name)
    with mvcc.connect(graphile._url("postgres")) as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _create_database("postgresql", name)
    history.run_django(PREFIX, ["-m", "django", "migrate", "-v", "0"])
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
    report: dict[str, Any] = {"args": vars(args), "steps": {}}
    with mvcc.connect(url) as conn:
        conn.execute("SET lock_timeout = '1s'")
        for step, statements in STEPS.items():
            report["steps"][step] = timed(
                probe, lambda s=statements, one=step == "swap": run_all(conn, s, one=one)
            )
            show(step, report["steps"][step])
            if step == "swap":
                probe.claims_from = "intents_live"
        days = conn.execute(
            f"SELECT {DAY.format('min(updated_at)')}, {DAY.format('now()')} + 2 FROM intents_live"
        ).fetchone()
        report["steps"]["partitions"] = timed(
            probe,
            lambda: run_all(
                conn,
                [
                    f"CREATE TABLE intents_done_{d} PARTITION OF {TABLE} "
                    f"FOR VALUES FROM ({d}) TO ({d + 1})"
                    for d in range(days[0], days[1] + 1)
                ],
            ),
        )
        show("partitions", report["steps"]["partitions"])
        batches: list[float] = []

        def move() -> None:
            while True:
                t0 = time.perf_counter()
                moved = conn.execute(MOVE, {"batch": args.batch}).rowcount
                if not moved:
                    return
                batches.append(time.perf_counter() - t0)

        report["steps"]["move"] = timed(probe, move)
        report["steps"]["move"].update(
            batches=len(batches),
            batch_p50_s=statistics.median(batches),
            batch_max_s=max(batches),
            rows_per_s=args.history / report["steps"]["move"]["seconds"],
        )
        show("move", report["steps"]["move"])
        probe.stopping.set()
        probe.join()
        after = count(conn)
        left = conn.execute(f"SELECT count(*) FROM intents_live WHERE {FINISHED}").fetchone()[0]
        keys = conn.execute("SELECT count(*) FROM intents_key").fetchone()[0]
    expected = {**before, "pending": before["pending"] + probe.number}
    if after != expected or left or keys != args.history:
        raise RuntimeError(
            f"rows before {before} (+{probe.number} probes), after {after}; "
            f"{left} finished left in the live partition, {keys} keys"
        )
    report["probes"] = {
        "sent": probe.number,
        "p50_ms": 1000 * statistics.median(s for _, s in probe.samples),
        "max_ms": 1000 * max(s for _, s in probe.samples),
    }
    report["rows"] = after
    print(f"probes: {report['probes']}; rows after: {after}")
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


def run_all(conn: Any, statements: list[str], *, one: bool = False) -> None:
    """The statements, each its own transaction, or all in one."""
    if one:
        with conn.transaction():
            run_all(conn, statements)
        return
    for statement in statements:
        conn.execute(statement)


def timed(probe: Probe, step: Any) -> dict[str, float]:
    began = time.perf_counter()
    step()
    ended = time.perf_counter()
    time.sleep(0.05)  # the probe under way at the end finishes
    times = probe.during(began, ended) or [0.0]
    return {
        "seconds": ended - began,
        "probes": len(times),
        "probe_p99_ms": 1000 * times[int(len(times) * 0.99)],
        "worst_probe_ms": 1000 * times[-1],
    }


def show(step: str, figures: dict[str, float]) -> None:
    print(
        f"{step:11} {figures['seconds']:8.3f} s   probes during it: p99 "
        f"{figures['probe_p99_ms']:7.1f} ms, slowest {figures['worst_probe_ms']:7.1f} ms",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
