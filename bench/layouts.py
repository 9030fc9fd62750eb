"""What each storage layout costs the PostgreSQL server per intent (issue 38: measure, then choose).

    .venv/bin/python bench/layouts.py [--n 20000] [--batch 100] [--history 0]
        [--layouts today,lean,split,split_keys] [--rounds 3] [--snapshot] [--json out.json]

No Python queue runs here: each layout is a schema and the statements a pool
would send to it (enqueue in batches, claim in batches with ``FOR UPDATE SKIP
LOCKED``, complete in batches fenced by token), sent from one process over
three connections, one per verb. What is measured is the *server's* side:
the CPU time of each connection's backend process (``/proc/<pid>/stat``),
divided by the intents it handled, and the WAL written per intent. The
client's time does not enter, so the figures hold on a busy machine.

Layouts:

- ``today``: the table migration 0009 makes: the row stays, a claim and a
  completion each update it in place (not HOT: indexed columns change), with
  the primary key and seven indexes.
- ``lean``: ``today`` without the indexes only the admin and retention use
  (created, kind/state/event, finished): what those indexes cost the hot path.
- ``split``: live intents in one table (primary key, claim, priority and
  lease indexes), finished ones in another (primary key, created,
  kind/state/event, finished); a completion moves the row in one statement
  (``DELETE … RETURNING`` into ``INSERT``). Enqueue checks the finished
  table for the id.
- ``split_keys``: ``split`` with an insert-only table of ids that decides
  idempotence, so that an enqueue racing a completion cannot resurrect it.
- ``lease``: ``today``, but a claim writes no indexed column: it locks the
  due rows and writes each lease (id, token, until) into a table of its
  own; a completion deletes the lease and updates the row once. The claim
  leaves out rows whose lease is live.
- ``split_lease``: ``split`` with ``lease``'s claim: a completion deletes
  the lease and moves the row.
- ``split_hot``: ``split``, but no index of the live table names a column a
  claim writes (no ``state`` predicate: every row there is pending or
  running; no lease index), and its pages are left 30 % free, so that a
  claim's update can be HOT: no index entry at all.
- ``split_parts``: ``split_lease`` with the finished table partitioned by
  day of ``updated_at`` (PostgreSQL's declarative partitions), each
  partition with its own admin indexes; history lies in older partitions,
  so a completion writes into the current day's small trees, and
  retention drops a day's partition whole.
- ``split_parts_keys``: ``split_parts`` whose idempotence is decided by an
  insert-only table of ids (as ``split_keys``), since no unique index spans
  partitions and an enqueue's look into the finished table cannot see a
  completion that commits while it waits; retention then deletes the day's
  keys as well as dropping its partition.
- ``split_parts_gens``: ``split_parts`` whose keys lie in generations, a
  table partitioned by the time the key was written (here: the current
  one, and two before it, splitting the history's days in halves). An
  enqueue writes its keys into the current generation (its primary key
  decides between enqueues) after looking for each in the older ones
  (nothing else ever writes there). Retention drops the day partitions and
  then whole generations, after copying into the current one the keys of
  the rows written in those generations that are kept: no key is deleted
  one by one.
- ``split_moved``: one table partitioned by state, the live intents in one
  partition, the finished ones in another partitioned by day; a completion
  is today's ``UPDATE``, which moves the row across. An enqueue writes its
  key first; the finished partitions' trigger writes the key of every row
  that arrives (one enqueued by other means); retention drops days and
  leaves their keys, which an enqueue takes for "may exist" and checks.

``--history H`` stores H finished intents first (finished a day before, so
that they lie in their own partition where the finished are partitioned;
``--days D`` spreads them over D daily partitions, as a retention of D days
would keep them, so that a look up by id probes D trees),
and after the run times retention removing them: ``DELETE`` by
``updated_at``, or dropping that day's partition, and the dead tuples left
for vacuum; ``--snapshot`` holds a
REPEATABLE READ snapshot open on a fourth connection for the whole run (the
bloat pressure of "Postgres Job Queues & Failure By MVCC").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg

DSN = os.environ.get("LAYOUTS_DSN", "host=127.0.0.1 user=postgres")
TICK = os.sysconf("SC_CLK_TCK")

COLUMNS = """
    id varchar(64) NOT NULL PRIMARY KEY,
    kind varchar(100) NOT NULL,
    event_id varchar(255) NOT NULL,
    target varchar(2048) NOT NULL,
    payload jsonb,
    state varchar(9) NOT NULL,
    attempts integer NOT NULL CHECK (attempts >= 0),
    next_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    last_error text NOT NULL,
    claim_token varchar(32) NOT NULL,
    claim_until timestamptz,
    snoozes integer NOT NULL DEFAULT 0 CHECK (snoozes >= 0),
    priority smallint NOT NULL DEFAULT 0 CHECK (priority >= -100 AND priority <= 100),
    trace_context varchar(1024) NOT NULL DEFAULT ''
"""
ACTIVE = "(state = 'pending' OR state = 'running')"
LIVE_INDEXES = f"""
CREATE INDEX {{t}}_claimable ON {{t}} (next_at, created_at, id, priority) WHERE {ACTIVE};
CREATE INDEX {{t}}_high ON {{t}} (priority DESC, next_at, created_at, id)
    WHERE {ACTIVE} AND priority > 0;
CREATE INDEX {{t}}_low ON {{t}} (priority DESC, next_at, created_at, id)
    WHERE {ACTIVE} AND priority < 0;
CREATE INDEX {{t}}_lease ON {{t}} (claim_until) WHERE state = 'running';
"""
ADMIN_INDEXES = """
CREATE INDEX {t}_created ON {t} (created_at, id);
CREATE INDEX {t}_kse ON {t} (kind, state, event_id);
CREATE INDEX {t}_finished ON {t} (updated_at) WHERE state = 'completed' OR state = 'cancelled';
"""
SCHEMAS = {
    "today": f"CREATE TABLE intents ({COLUMNS});"
    + LIVE_INDEXES.format(t="intents")
    + ADMIN_INDEXES.format(t="intents"),
    "lean": f"CREATE TABLE intents ({COLUMNS});" + LIVE_INDEXES.format(t="intents"),
    "split": f"CREATE TABLE intents ({COLUMNS}); CREATE TABLE done ({COLUMNS});"
    + LIVE_INDEXES.format(t="intents")
    + ADMIN_INDEXES.format(t="done"),
}
KEYS = "CREATE TABLE keys (id varchar(64) PRIMARY KEY);"
SCHEMAS["split_keys"] = SCHEMAS["split"] + KEYS
LEASES = (
    "CREATE TABLE leases (id varchar(64) PRIMARY KEY, token varchar(32) NOT NULL, "
    "until timestamptz NOT NULL);"
)
LEASED = ("lease", "split_lease", "split_parts")
SCHEMAS["split_hot"] = (
    f"CREATE TABLE intents ({COLUMNS}) WITH (fillfactor = 70); CREATE TABLE done ({COLUMNS});"
    + "CREATE INDEX intents_claimable ON intents (next_at, created_at, id, priority);"
    + "CREATE INDEX intents_high ON intents (priority DESC, next_at, created_at, id) "
    + "WHERE priority > 0;"
    + "CREATE INDEX intents_low ON intents (priority DESC, next_at, created_at, id) "
    + "WHERE priority < 0;"
    + ADMIN_INDEXES.format(t="done")
)
SCHEMAS["lease"] = SCHEMAS["today"] + LEASES
SCHEMAS["split_lease"] = SCHEMAS["split"] + LEASES
# Finished intents by day: the history in the days before (``days_before``), the run today.
SCHEMAS["split_parts"] = (
    f"CREATE TABLE intents ({COLUMNS});"
    + LIVE_INDEXES.format(t="intents")
    + LEASES
    + f"CREATE TABLE done ({COLUMNS.replace(' PRIMARY KEY', '')}) PARTITION BY RANGE (updated_at);"
    + "CREATE TABLE done_today PARTITION OF done FOR VALUES FROM (date_trunc('day', now())) "
    + "TO (date_trunc('day', now()) + interval '2 days');"
    + "CREATE INDEX done_id ON done (id);"
    + ADMIN_INDEXES.format(t="done")
)
SCHEMAS["split_parts_keys"] = (
    SCHEMAS["split_parts"] + "CREATE TABLE keys (id varchar(64) PRIMARY KEY);"
)
# Key generations by the time a key was written: keys_now takes today's, the
# history's lie in keys_mid (its newer half of days) and keys_old.
SCHEMAS["split_parts_gens"] = (
    SCHEMAS["split_parts"]
    + "CREATE TABLE keys (id varchar(64) NOT NULL, at timestamptz NOT NULL) "
    + "PARTITION BY RANGE (at);"
    + "CREATE TABLE keys_now PARTITION OF keys (PRIMARY KEY (id)) "
    + "FOR VALUES FROM (date_trunc('day', now())) TO (MAXVALUE);"
)
GENERATIONS = ("keys_old", "keys_mid")
# One table partitioned by state: a completion is a plain UPDATE that moves its
# row into the finished day's partition, whose trigger writes the row's key.
SCHEMAS["split_moved"] = (
    f"CREATE TABLE intents ({COLUMNS.replace(' PRIMARY KEY', '')}) PARTITION BY LIST (state);"
    + "CREATE TABLE intents_live PARTITION OF intents (PRIMARY KEY (id)) "
    + "FOR VALUES IN ('pending', 'running');"
    + LIVE_INDEXES.format(t="intents_live")
    + "CREATE TABLE done PARTITION OF intents FOR VALUES IN ('completed', 'cancelled') "
    + "PARTITION BY RANGE (updated_at);"
    + "CREATE TABLE done_today PARTITION OF done FOR VALUES FROM (date_trunc('day', now())) "
    + "TO (date_trunc('day', now()) + interval '2 days');"
    + "CREATE INDEX done_id ON done (id);"
    + ADMIN_INDEXES.format(t="done")
    + KEYS
    + "CREATE FUNCTION keep_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    + "INSERT INTO keys VALUES (NEW.id) ON CONFLICT DO NOTHING; RETURN NULL; END $$;"
    + "CREATE TRIGGER done_key AFTER INSERT ON done FOR EACH ROW EXECUTE FUNCTION keep_key();"
)
LEASED = (*LEASED, "split_parts_keys", "split_parts_gens")
PARTED = ("split_parts", "split_parts_keys", "split_parts_gens", "split_moved")
KEYED = ("split_keys", "split_parts_keys")

INSERT_ROWS = (
    "SELECT v.id, 'noop', v.id, 'https://partner.example/', '{}'::jsonb, 'pending', 0, "
    "now(), now(), now(), '', '', NULL::timestamptz, 0, 0::smallint, '' "
    "FROM unnest(%s::text[]) AS v(id)"
)
ENQUEUE = {
    "today": f"INSERT INTO intents {INSERT_ROWS} ON CONFLICT (id) DO NOTHING",
    "split": f"INSERT INTO intents {INSERT_ROWS} "
    "WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = v.id) ON CONFLICT (id) DO NOTHING",
    "split_keys": "WITH k AS (INSERT INTO keys SELECT unnest(%s::text[]) "
    "ON CONFLICT DO NOTHING RETURNING id) "
    f"INSERT INTO intents {INSERT_ROWS.replace('unnest(%s::text[]) AS v(id)', 'k AS v')}",
}
ENQUEUE["lean"] = ENQUEUE["lease"] = ENQUEUE["today"]
ENQUEUE["split_lease"] = ENQUEUE["split_parts"] = ENQUEUE["split_hot"] = ENQUEUE["split"]
ENQUEUE["split_parts_keys"] = ENQUEUE["split_keys"]
ENQUEUE["split_moved"] = ENQUEUE["split_keys"].replace(
    "INSERT INTO intents ", "INSERT INTO intents_live "
)
ENQUEUE["split_parts_gens"] = (
    "WITH k AS (INSERT INTO keys_now (id, at) SELECT v.id, now() FROM unnest(%s::text[]) AS v(id) "
    "WHERE "
    + " AND ".join(f"NOT EXISTS (SELECT 1 FROM {g} WHERE {g}.id = v.id)" for g in GENERATIONS)
    + " ON CONFLICT (id) DO NOTHING RETURNING id) "
    + f"INSERT INTO intents {INSERT_ROWS.replace('unnest(%s::text[]) AS v(id)', 'k AS v')}"
)
CLAIM = (
    "WITH due AS MATERIALIZED (SELECT id FROM intents WHERE "
    f"{ACTIVE} AND next_at <= now() AND NOT (state = 'running' AND claim_until > now()) "
    "AND priority = 0 ORDER BY next_at, created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
    "UPDATE intents AS t SET state = 'running', attempts = t.attempts + 1, "
    "claim_token = md5(%s || t.id), claim_until = now() + interval '30 seconds', "
    "updated_at = now() FROM due WHERE t.id = due.id RETURNING t.id, t.claim_token"
)
# The due rows without a live lease, locked; a lease each, taking over an expired one.
CLAIM_LEASE = (
    "WITH due AS MATERIALIZED (SELECT id FROM intents WHERE "
    f"{ACTIVE} AND next_at <= now() AND NOT EXISTS (SELECT 1 FROM leases AS l "
    "WHERE l.id = intents.id AND l.until > now()) "
    "AND priority = 0 ORDER BY next_at, created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
    "INSERT INTO leases (id, token, until) SELECT due.id, md5(%s || due.id), "
    "now() + interval '30 seconds' FROM due ON CONFLICT (id) DO UPDATE "
    "SET token = excluded.token, until = excluded.until RETURNING id, token"
)
COMPLETE_IN_PLACE = (
    "UPDATE intents AS t SET state = 'completed', claim_token = '', claim_until = NULL, "
    "updated_at = now() FROM unnest(%s::text[], %s::text[]) AS v(id, token) "
    "WHERE t.id = v.id AND t.claim_token = v.token"
)
COMPLETE_MOVE = (
    "WITH moved AS (DELETE FROM intents AS t USING unnest(%s::text[], %s::text[]) "
    "AS v(id, token) WHERE t.id = v.id AND t.claim_token = v.token RETURNING t.*) "
    "INSERT INTO done SELECT id, kind, event_id, target, payload, 'completed', attempts, "
    "next_at, created_at, now(), last_error, '', NULL, snoozes, priority, trace_context "
    "FROM moved"
)
ENDED_LEASES = (
    "WITH ended AS (DELETE FROM leases AS l USING unnest(%s::text[], %s::text[]) "
    "AS v(id, token) WHERE l.id = v.id AND l.token = v.token RETURNING l.id) "
)
COMPLETE_LEASE = (
    ENDED_LEASES + "UPDATE intents AS t SET state = 'completed', attempts = t.attempts + 1, "
    "updated_at = now() FROM ended WHERE t.id = ended.id"
)
COMPLETE_LEASE_MOVE = (
    ENDED_LEASES + ", moved AS (DELETE FROM intents AS t USING ended WHERE t.id = ended.id "
    "RETURNING t.*) "
    "INSERT INTO done SELECT id, kind, event_id, target, payload, 'completed', attempts + 1, "
    "next_at, created_at, now(), last_error, '', NULL, snoozes, priority, trace_context "
    "FROM moved"
)
# The claim's rows stay in the live partition (pending to running): named there.
CLAIM_LIVE = CLAIM.replace("FROM intents WHERE", "FROM intents_live WHERE").replace(
    "UPDATE intents AS", "UPDATE intents_live AS"
)
COMPLETE = {
    "split_moved": COMPLETE_IN_PLACE + " AND t.state = 'running'",
    "lease": COMPLETE_LEASE,
    "split_lease": COMPLETE_LEASE_MOVE,
    "split_parts": COMPLETE_LEASE_MOVE,
    "split_parts_keys": COMPLETE_LEASE_MOVE,
    "split_parts_gens": COMPLETE_LEASE_MOVE,
    "today": COMPLETE_IN_PLACE,
    "lean": COMPLETE_IN_PLACE,
    "split": COMPLETE_MOVE,
    "split_keys": COMPLETE_MOVE,
    "split_hot": COMPLETE_MOVE,
}


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of one server process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Verb:
    """One connection that sends one kind of statement, and the server CPU it cost."""

    def __init__(self, dbname: str) -> None:
        self.conn = psycopg.connect(f"{DSN} dbname={dbname}", autocommit=True)
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.cpu = 0.0

    def run(self, sql: str, params: Any) -> list[Any]:
        before = cpu_seconds(self.pid)
        cursor = self.conn.execute(sql, params)
        rows = cursor.fetchall() if cursor.description else []
        self.cpu += cpu_seconds(self.pid) - before
        return rows


def wal(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


def days_before(days: int) -> str:
    """The daily partitions of the history: done_old_1 (yesterday) to done_old_<days>."""
    return "".join(
        f"CREATE TABLE done_old_{d} PARTITION OF done FOR VALUES "
        f"FROM (date_trunc('day', now()) - interval '{d} days') "
        f"TO (date_trunc('day', now()) - interval '{d - 1} days');"
        for d in range(1, days + 1)
    )


def one_run(
    layout: str, n: int, batch: int, history: int, snapshot: bool, days: int = 1
) -> dict[str, Any]:
    dbname = f"layouts_{layout}"
    with psycopg.connect(DSN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {dbname}")
    with psycopg.connect(f"{DSN} dbname={dbname}", autocommit=True) as setup:
        setup.execute(SCHEMAS[layout])
        if layout in PARTED:
            setup.execute(days_before(days))
        if layout == "split_parts_gens":  # the older half of the days, and the newer
            half = (days + 1) // 2
            setup.execute(
                "CREATE TABLE keys_old PARTITION OF keys (PRIMARY KEY (id)) FOR VALUES FROM "
                f"(MINVALUE) TO (date_trunc('day', now()) - interval '{half} days');"
                "CREATE TABLE keys_mid PARTITION OF keys (PRIMARY KEY (id)) FOR VALUES FROM "
                f"(date_trunc('day', now()) - interval '{half} days') TO (date_trunc('day', now()))"
            )
        if history:
            table = "done" if layout.startswith("split") else "intents"
            setup.execute(  # finished in the days before: in done_old_* where partitioned
                f"INSERT INTO {table} SELECT md5('h' || g), 'noop', 'h' || g, 't', '{{}}', "
                "'completed', 1, w.at, w.at, w.at, '', '', NULL, 0, 0, '' "
                "FROM generate_series(1, %s) AS g, LATERAL (SELECT date_trunc('day', now()) "
                "- make_interval(days => g %% %s) - interval '12 hours' AS at) AS w",
                [history, days],
            )
            if layout in KEYED:
                setup.execute("INSERT INTO keys SELECT id FROM done")
            if layout == "split_parts_gens":
                setup.execute("INSERT INTO keys SELECT id, created_at FROM done")
        setup.execute("VACUUM ANALYZE")
        holder = None
        if snapshot:
            holder = psycopg.connect(f"{DSN} dbname={dbname}")
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pg_class").fetchone()
        enqueue, claim, complete = Verb(dbname), Verb(dbname), Verb(dbname)
        started_wal, started = wal(setup), time.perf_counter()
        ids = [uuid.uuid4().hex for _ in range(n)]
        for at in range(0, n, batch):
            enqueue.run(ENQUEUE[layout], [ids[at : at + batch]])
        done = 0
        salt = uuid.uuid4().hex
        claim_seconds: list[float] = []
        while done < n:
            t0 = time.perf_counter()
            statement = CLAIM_LIVE if layout == "split_moved" else CLAIM
            claimed = claim.run(CLAIM_LEASE if layout in LEASED else statement, [batch, salt])
            claim_seconds.append(time.perf_counter() - t0)
            if not claimed:
                break
            complete.run(COMPLETE[layout], [[r[0] for r in claimed], [r[1] for r in claimed]])
            done += len(claimed)
        seconds = time.perf_counter() - started
        written = wal(setup) - started_wal
        again = setup.execute(ENQUEUE[layout], [ids[:batch]]).rowcount  # finished: idempotent
        if again:
            raise RuntimeError(f"{layout}: {again} finished intents enqueued a second time")
        for verb in (enqueue, claim, complete):  # their counts into the statistics now
            verb.conn.execute("SELECT pg_stat_force_next_flush()")
        setup.execute("SELECT pg_stat_force_next_flush()")
        updated, hot = setup.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'intents'"
        ).fetchone()
        left = setup.execute("SELECT count(*) FROM intents WHERE state <> 'completed'").fetchone()[
            0
        ]
        if layout.startswith("split"):
            finished = setup.execute("SELECT count(*) FROM done").fetchone()[0]
            if finished != n + history:
                raise RuntimeError(f"{layout}: {finished} finished rows, not {n + history}")
        size = setup.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        if holder is not None:
            holder.close()
        pruned = prune(setup, layout, days) if history else {}
        for verb in (enqueue, claim, complete):
            verb.conn.close()
    if done != n or left:
        raise RuntimeError(f"{layout}: {done} of {n} completed, {left} left unfinished")
    claim_seconds.sort()
    return {
        "layout": layout,
        "enqueue_us": enqueue.cpu / n * 1e6,
        "claim_us": claim.cpu / n * 1e6,
        "complete_us": complete.cpu / n * 1e6,
        "server_us": (enqueue.cpu + claim.cpu + complete.cpu) / n * 1e6,
        "wal_bytes": written / n,
        "claim_p99_ms": claim_seconds[int(len(claim_seconds) * 0.99)] * 1000,
        "per_s": n / seconds,
        "db_mb": size / 2**20,
        "hot_share": hot / updated if updated else 0.0,
        **pruned,
    }


def prune(conn: psycopg.Connection[Any], layout: str, days: int) -> dict[str, Any]:
    """Retention of the history: partitions dropped (their keys deleted), or rows deleted."""
    table = "done" if layout.startswith("split") else "intents"
    olds = [f"done_old_{d}" for d in range(1, days + 1)]
    if layout in PARTED:
        removed = sum(conn.execute(f"SELECT count(*) FROM {old}").fetchone()[0] for old in olds)
    began = time.perf_counter()
    if layout in PARTED:
        for old in olds:
            if layout in KEYED:
                conn.execute(f"DELETE FROM keys USING {old} WHERE keys.id = {old}.id")
            conn.execute(f"ALTER TABLE done DETACH PARTITION {old}")
            conn.execute(f"DROP TABLE {old}")
        if layout == "split_parts_gens":  # the kept rows' keys move on, the generations go
            bounds = " OR ".join(f"created_at < (SELECT max(at) FROM {g})" for g in GENERATIONS)
            conn.execute(
                "INSERT INTO keys_now (id, at) SELECT id, now() FROM intents "
                f"WHERE {bounds} UNION ALL SELECT id, now() FROM done WHERE {bounds}"
            )
            for generation in GENERATIONS:
                conn.execute(f"ALTER TABLE keys DETACH PARTITION {generation}")
                conn.execute(f"DROP TABLE {generation}")
    else:
        removed = conn.execute(
            f"DELETE FROM {table} WHERE updated_at < date_trunc('day', now())"
        ).rowcount
    seconds = time.perf_counter() - began
    conn.execute("SELECT pg_stat_force_next_flush()")
    dead = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
        "WHERE relname LIKE %s OR relname LIKE 'keys%%'",
        [f"{table}%"],
    ).fetchone()[0]
    return {"prune_s": seconds, "pruned": removed, "dead_after_prune": int(dead)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--layouts", default=",".join(SCHEMAS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--snapshot", action="store_true")
    parser.add_argument("--days", type=int, default=1, help="daily partitions of the history")
    parser.add_argument("--json")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    unknown = [layout for layout in layouts if layout not in SCHEMAS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; choose from {', '.join(SCHEMAS)}")
    runs = []
    for number in range(args.rounds):
        for layout in layouts[number % len(layouts) :] + layouts[: number % len(layouts)]:
            result = one_run(layout, args.n, args.batch, args.history, args.snapshot, args.days)
            runs.append(result)
            print(
                json.dumps(
                    {k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}
                ),
                file=sys.stderr,
                flush=True,
            )
    keys = [
        "enqueue_us",
        "claim_us",
        "complete_us",
        "server_us",
        "wal_bytes",
        "claim_p99_ms",
        "per_s",
        "db_mb",
        "hot_share",
    ]
    if args.history:
        keys += ["prune_s", "dead_after_prune"]
    print("| layout | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for layout in layouts:
        mine = [r for r in runs if r["layout"] == layout]
        print(
            f"| {layout} | "
            + " | ".join(f"{statistics.median(r[k] for r in mine):,.1f}" for k in keys)
            + " |"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "runs": runs}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
