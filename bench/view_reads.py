"""What the admin's reads cost over live and finished intents split in two (issue 38).

    .venv/bin/python bench/view_reads.py [--history 5000000] [--live 20000] [--days 30]
        [--rounds 5] [--drop-days 6] [--keep] [--json out.json]

The layouts ``bench/layouts.py`` measured point to live intents in one table
and finished ones in another, partitioned by day so that retention drops a
day whole. ``Intent`` would then read both as one: a view, ``SELECT ... FROM
live UNION ALL SELECT ... FROM done``. This measures whether the admin's
reads stay as fast over that view as over today's one table, with the same
rows in both: ``--history`` finished intents spread over ``--days`` days and
``--live`` pending ones.

- ``today``: one table with migration 0009's indexes (the primary key,
  ``(created_at, id)``, ``(kind, state, event_id)``, finished ``updated_at``,
  the claim index);
- ``view``: ``live`` (primary key, claim index) and ``done`` partitioned by
  day of ``updated_at``, each partition with ``id``, ``(created_at, id)``,
  ``(kind, state, event_id)`` and ``updated_at`` indexes (``live`` has
  ``(created_at, id)`` and ``(kind, event_id)``: no index of it names a
  column a claim writes); the view over both.

The reads are the admin's (docs/operations.md, "Big tables"): the list
newest first, its page 500, the list filtered by kind and state, one intent
by id, a search by event id (one lookup per kind and state), and the
pending count of a kind; then retention of the oldest ``--drop-days`` days
(a fifth of the history by default), a ``DELETE`` in ``today`` against
dropping their partitions in ``view``. Each read's median of
``--rounds`` runs after one warm-up, the two layouts taking turns. Every
read's rows are compared between the two layouts: the same ids, in the same
order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

DSN = os.environ.get("LAYOUTS_DSN", "host=127.0.0.1 user=postgres")
KINDS = ("webhook", "push", "replicate")

COLUMNS = """
    id varchar(64) NOT NULL,
    kind varchar(100) NOT NULL,
    event_id varchar(255) NOT NULL,
    target varchar(2048) NOT NULL,
    payload jsonb,
    state varchar(9) NOT NULL,
    attempts integer NOT NULL,
    next_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    last_error text NOT NULL,
    claim_token varchar(32) NOT NULL,
    claim_until timestamptz,
    priority smallint NOT NULL DEFAULT 0
"""
ACTIVE = "(state = 'pending' OR state = 'running')"
NAMES = "id, kind, event_id, target, payload, state, attempts, next_at, created_at, updated_at, "
NAMES += "last_error, claim_token, claim_until, priority"


def schema(layout: str, days: int) -> str:
    if layout == "today":
        return f"""
        CREATE TABLE intents ({COLUMNS}, PRIMARY KEY (id));
        CREATE INDEX ON intents (next_at, created_at, id, priority) WHERE {ACTIVE};
        CREATE INDEX ON intents (created_at, id);
        CREATE INDEX ON intents (kind, state, event_id);
        CREATE INDEX ON intents (updated_at) WHERE state = 'completed' OR state = 'cancelled';
        """
    parts = "".join(
        f"CREATE TABLE done_{day} PARTITION OF done FOR VALUES FROM "
        f"(date_trunc('day', now()) - interval '{day} days') "
        f"TO (date_trunc('day', now()) - interval '{day - 1} days');"
        for day in range(days + 1, -1, -1)  # one more: the oldest rows start an hour earlier
    )
    return f"""
    CREATE TABLE live ({COLUMNS}, PRIMARY KEY (id));
    CREATE INDEX ON live (next_at, created_at, id, priority);
    CREATE INDEX ON live (created_at, id);
    CREATE INDEX ON live (kind, event_id);
    CREATE TABLE done ({COLUMNS}) PARTITION BY RANGE (updated_at);
    {parts}
    CREATE INDEX ON done (id);
    CREATE INDEX ON done (created_at, id);
    CREATE INDEX ON done (kind, state, event_id);
    CREATE INDEX ON done (updated_at);
    CREATE VIEW intents AS SELECT {NAMES} FROM live UNION ALL SELECT {NAMES} FROM done;
    """


def fill(
    conn: psycopg.Connection[Any], layout: str, history: int, live: int, days: int, base: datetime
) -> None:
    """The same rows in both layouts: ids, and times before ``base``, from the row's number."""
    done = "intents" if layout == "today" else "done"
    pending = "intents" if layout == "today" else "live"
    step = days * 86_400.0 / history
    for first in range(0, history, 500_000):
        last = min(first + 500_000, history) - 1
        conn.execute(
            f"""
            INSERT INTO {done} ({NAMES})
            SELECT md5('h' || g), (ARRAY['webhook','push','replicate'])[1 + g %% 3],
              'h' || g, 'https://partner' || (g %% 100) || '.example/', '{{}}',
              CASE WHEN g %% 50 = 0 THEN 'cancelled' ELSE 'completed' END, 1,
              t, t, t, '', '', NULL, 0
            FROM (SELECT g, %s - make_interval(secs => (%s - g) * %s) - interval '1 hour' AS t
                  FROM generate_series(%s, %s) AS g) AS s
            """,
            [base, history, step, first, last],
        )
    conn.execute(
        f"""
        INSERT INTO {pending} ({NAMES})
        SELECT md5('l' || g), (ARRAY['webhook','push','replicate'])[1 + g %% 3], 'l' || g,
          'https://partner' || (g %% 100) || '.example/', '{{}}', 'pending', 0,
          %s, %s - make_interval(secs => g * 0.001), %s, '', '', NULL, 0
        FROM generate_series(1, %s) AS g
        """,
        [base, base, base, live],
    )
    conn.execute("VACUUM ANALYZE")


def reads(history: int) -> dict[str, tuple[str, list[Any]]]:
    """The admin's reads, by name: (SQL, parameters), each returning ids in order."""
    middle = f"h{history // 2}"
    return {
        "list, newest first": (
            "SELECT id FROM intents ORDER BY created_at DESC, id DESC LIMIT 100",
            [],
        ),
        "list, page 500": (
            "SELECT id FROM intents ORDER BY created_at DESC, id DESC LIMIT 100 OFFSET 49900",
            [],
        ),
        "kind and state filter": (
            "SELECT id FROM intents WHERE kind = 'push' AND state = 'cancelled' "
            "ORDER BY created_at DESC, id DESC LIMIT 100",
            [],
        ),
        "one intent by id": (
            "SELECT id FROM intents WHERE id = md5(%s)",
            [middle],
        ),
        "search by event id": (
            "SELECT id FROM intents WHERE kind IN ('webhook', 'push', 'replicate') "
            "AND state IN ('pending', 'running', 'completed', 'cancelled') AND event_id = %s "
            "ORDER BY created_at DESC, id DESC LIMIT 100",
            [middle],
        ),
        "pending of a kind": (
            "SELECT count(*) FROM (SELECT 1 FROM intents WHERE kind = 'webhook' "
            "AND state = 'pending' LIMIT 1001) AS c",
            [],
        ),
    }


def timed(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> tuple[float, list[Any]]:
    began = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    return time.perf_counter() - began, rows


def retention(conn: psycopg.Connection[Any], layout: str, days: int, drop: int) -> dict[str, Any]:
    """The oldest ``drop`` days removed: deleted row by row, or their partitions dropped.

    Partition ``done_d`` holds the rows finished from ``d`` days before today's
    midnight to a day later, so dropping ``done_{days+1}`` down to
    ``done_{days-drop+1}`` removes what finished before midnight ``days - drop``
    days ago, as the ``DELETE`` does.
    """
    if layout == "today":
        cutoff = f"date_trunc('day', now()) - interval '{days - drop} days'"
        began = time.perf_counter()
        removed = conn.execute(f"DELETE FROM intents WHERE updated_at < {cutoff}").rowcount
    else:
        old = [f"done_{day}" for day in range(days + 1, days - drop, -1)]
        removed = sum(conn.execute(f"SELECT count(*) FROM {part}").fetchone()[0] for part in old)
        began = time.perf_counter()
        for part in old:
            conn.execute(f"ALTER TABLE done DETACH PARTITION {part}")
            conn.execute(f"DROP TABLE {part}")
    seconds = time.perf_counter() - began
    conn.execute("SELECT pg_stat_force_next_flush()")
    dead = conn.execute("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables").fetchone()
    return {"removed": removed, "seconds": seconds, "dead": int(dead[0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--live", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--drop-days", type=int, default=6, help="days retention removes")
    parser.add_argument("--keep", action="store_true", help="reuse filled databases")
    parser.add_argument("--json")
    args = parser.parse_args()
    layouts = ("today", "view")
    base = datetime.now(UTC)  # the rows' times, the same in both layouts
    conns = {}
    for layout in layouts:
        name = f"viewreads_{layout}"
        with psycopg.connect(DSN, autocommit=True) as admin:
            exists = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [name]
            ).fetchone()
            if not (args.keep and exists):
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                admin.execute(f"CREATE DATABASE {name}")
        conn = psycopg.connect(f"{DSN} dbname={name}", autocommit=True)
        if not (args.keep and exists):
            began = time.perf_counter()
            conn.execute(schema(layout, args.days))
            fill(conn, layout, args.history, args.live, args.days, base)
            print(f"{layout}: filled in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        conns[layout] = conn
    figures: dict[str, dict[str, list[float]]] = {layout: {} for layout in layouts}
    for name, (sql, params) in reads(args.history).items():
        answers = {}
        for layout in layouts:
            _, answers[layout] = timed(conns[layout], sql, params)  # warm-up
        if answers["today"] != answers["view"] or not answers["today"]:  # same ids, same order
            raise RuntimeError(f"{name}: the layouts answered differently or not at all")
        for number in range(args.rounds):
            for layout in layouts if number % 2 == 0 else layouts[::-1]:
                seconds, _ = timed(conns[layout], sql, params)
                figures[layout].setdefault(name, []).append(seconds)
    print("| read | one table ms | live + finished by day, a view ms |")
    print("|---|---|---|")
    for name in reads(args.history):
        today, view = (statistics.median(figures[layout][name]) * 1000 for layout in layouts)
        print(f"| {name} | {today:.2f} | {view:.2f} |")
    removed = {
        layout: retention(conns[layout], layout, args.days, args.drop_days) for layout in layouts
    }
    if removed["today"]["removed"] != removed["view"]["removed"]:
        raise RuntimeError(f"retention removed different rows: {removed}")
    for layout, figure in removed.items():
        print(
            f"retention, {layout}: {figure['removed']:,} rows of the oldest days in "
            f"{figure['seconds']:.2f} s, {figure['dead']:,} dead tuples left"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "reads": figures, "retention": removed}, out, indent=2)
    for conn in conns.values():
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
