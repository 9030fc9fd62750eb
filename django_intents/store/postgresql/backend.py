"""PostgreSQL: a claim is one statement, and a new or re-queued intent notifies idle pools.

Statements go out through psycopg 3's server-side binding (``cursor()``), so
the server parses each text once per connection however the values change.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django_intents.store.base import (
    CLEAR_CLAIM,
    COMPLETED,
    DUE,
    NOTIFY_CHANNEL,
    PENDING,
    PRIORITY_CHANNEL,
    RUNNING,
    Backend,
    Ending,
    Finished,
    claim_order,
)
from django_intents.store.claims import (
    BRANCHES,
    FLOOR,
    Claimed,
    ClaimFilters,
    Claims,
    Riders,
    branch_parts,
    branch_union,
)
from django_intents.store.postgresql.cursors import ServerBoundCursors
from django_intents.store.postgresql.heldhead import Level
from django_intents.store.postgresql.limited import LimitedClaims
from django_intents.store.rows import hydrate, to_values

# The columns a new intent takes from its caller; the rest are fixed or the batch's time.
JSON_COLUMNS = ("id", "kind", "event_id", "target", "payload", "next_at", "priority")
# A batch's rows ("v", from its arrays) to the rows they name: by key, and fenced by
# the token, which is never empty (so the row is running, see the batches below).
BATCH_ROW_BY_KEY = "t.id = v.id AND t.claim_token = v.token AND v.token <> ''"
JSON_TYPES = (
    "id text, kind text, event_id text, target text, payload jsonb, next_at timestamptz, "
    "priority smallint, trace_context text"
)


class PostgreSQLBackend(LimitedClaims, ServerBoundCursors, Backend):
    vendor = "postgresql"
    # ``now()`` is the transaction's start: a claim inside a long transaction
    # would judge leases by a stale time.
    sql_clock = "SELECT clock_timestamp()"
    # The paused kinds as an array computed once per statement (an InitPlan).
    # Spelled as a CASE the planner cannot see into, the test is taken to keep
    # almost every row, so the claim still walks the claim index in order and
    # stops at LIMIT; as "kind <> ALL (...)" it was estimated to keep one row
    # and the planner sorted every due row (as in sql_limited_claim; the plan
    # is checked by tests/test_pause.py).
    sql_not_paused = (
        " AND (CASE WHEN kind = ANY (ARRAY(SELECT kind FROM {paused})) THEN NULL ELSE 1 END)"
        " IS NOT NULL"
    )

    def __init__(self, alias: str, model: Any) -> None:
        super().__init__(alias, model)
        table, cols = self.table, self.column_list
        # Inserted rows notify idle workers; NOTIFY is delivered at commit and
        # dropped on rollback, which is exactly the outbox promise. One
        # notification and one result row per kind, not per intent.
        # A kind with intents of another priority among them is named on
        # PRIORITY_CHANNEL too.
        notify = (
            f"SELECT kind, count(*), pg_notify('{NOTIFY_CHANNEL}', kind), "
            f"CASE WHEN bool_or(priority <> 0) THEN pg_notify('{PRIORITY_CHANNEL}', kind) END "
            f"FROM ins GROUP BY kind"
        )
        self.sql_insert = (
            f"WITH ins AS (INSERT INTO {table} ({cols}) VALUES {{rows}} "
            f"ON CONFLICT (id) DO NOTHING RETURNING kind, priority) {notify}"
        )
        # The same insert with the varying columns of every row in one JSON
        # array: a statement whose text never changes with the batch size, so
        # the client parses it once, and one parameter to adapt instead of
        # thirteen per row. A JSON null payload becomes SQL NULL, as it does
        # through VALUES. A row carries next_at only when it was given one.
        self.sql_insert_json = (
            f"WITH ins AS (INSERT INTO {table} ({cols}) "
            f"SELECT {self._json_select()} FROM jsonb_to_recordset(%s::jsonb) AS r({JSON_TYPES}) "
            f"ON CONFLICT (id) DO NOTHING RETURNING kind, priority) {notify}"
        )
        # The inner SELECT is the fence between claimers: it locks the rows it
        # picks and skips rows another claimer has locked, so concurrent claims
        # never see the same intent. MATERIALIZED keeps it from being inlined
        # and evaluated more than once.
        # Each branch (claims.Branch) is such a SELECT, limited to what the
        # claim still needs after the branches before it, so that exactly the
        # intents claimed are locked.
        branches = branch_parts(
            f"{{name}} AS MATERIALIZED (SELECT id, state AS was, claim_until AS lease_end "
            f"FROM {table} WHERE {DUE} AND {{branch}}{{filters}} {{order}} LIMIT {{room}} "
            f"FOR UPDATE SKIP LOCKED)"
        )
        # The outer LIMIT changes nothing (the branches' rooms add up to it) but
        # tells the planner how few rows come: a limit it cannot compute is taken
        # as a tenth of the table, and it would then hash the whole table to join.
        self.sql_claim = (
            f"WITH {', '.join(branches)}, due AS (SELECT * FROM ({branch_union(BRANCHES)}) AS u "
            f"LIMIT %s) "
            f"UPDATE {table} AS t SET state = '{RUNNING}', attempts = t.attempts + 1, "
            f"claim_token = md5(%s || t.id), claim_until = %s, updated_at = %s "
            f"FROM due WHERE t.id = due.id "
            f"RETURNING {', '.join('t.' + self.connection.ops.quote_name(c) for c in self.columns)}"
            f", due.was, due.lease_end"
        )
        # The claim of priority 0 alone: the statement of the claim before
        # priorities, which plans in a third of the time of the three branches.
        returned = ", ".join("t." + self.connection.ops.quote_name(c) for c in self.columns)
        self.sql_claim_zero = (
            f"WITH due AS MATERIALIZED (SELECT id, state AS was, claim_until AS lease_end "
            f"FROM {table} WHERE {DUE} AND priority = 0{{filters}}{FLOOR} "
            f"ORDER BY next_at, created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE {table} AS t SET state = '{RUNNING}', attempts = t.attempts + 1, "
            f"claim_token = md5(%s || t.id), claim_until = %s, updated_at = %s "
            f"FROM due WHERE t.id = due.id RETURNING {returned}, due.was, due.lease_end"
        )
        # Per claimed kinds: whether intents of other priorities may be due
        # (claim_by_priority); the listener's hint sets it (others_due).
        self._others_due: dict[tuple[str, ...] | None, bool] = {}
        # How many hints the listener has given; a claim that began before one
        # must not clear it (``settle_others``).
        self._heard = 0
        # Per limited kinds: until when they claim exactly (``claim_limited``).
        self._tight: dict[tuple[str, ...], float] = {}
        # Per claim (``heldhead.key_of``): the held-back head an exact claim starts past.
        self._held_heads: dict[tuple[Any, ...], list[Level]] = {}
        self.build_limited(returned)
        # Arrays keep the statement text the same whatever the batch size.
        # The batches join their rows by key and token (BATCH_ROW_BY_KEY) and
        # test no state: a token is never empty, and only a running intent has
        # one (the check intents_claim_only_when_running). A state test let the
        # planner choose from the statistics of the state: it hash-joined the
        # batch against every entry of the lease index (on a churned table, the
        # dead ones of every claim ever made: 64 ms for a batch of 400), and,
        # spelled "IS TRUE" to avoid that, it took an ANALYZE of a table of
        # pending intents to say that one row runs, and compared every running
        # row with every row of the batch (up to 2.3 s a batch; a drain of
        # 20,000 took 40 s instead of 1.5 and lost leases). With no state test
        # the join is by primary key on a large table and a hash join over one
        # pass of the table on a small one: linear either way.
        self.sql_complete_many = (
            f"UPDATE {table} AS t SET state = '{COMPLETED}', {CLEAR_CLAIM}, "
            f"updated_at = %s FROM unnest(%s::text[], %s::text[]) AS v(id, token) "
            f"WHERE {BATCH_ROW_BY_KEY} RETURNING t.id, t.kind"
        )
        # A batch of retries, cancellations and releases (``Ending``), each fenced.
        self.sql_finish_many = (
            f"UPDATE {table} AS t SET state = v.state, "
            f"next_at = COALESCE(v.next_at, t.next_at), "
            f"last_error = COALESCE(v.error, t.last_error), "
            f"last_traceback = COALESCE(v.trace, t.last_traceback), "
            f"snoozes = t.snoozes + CASE WHEN v.snooze THEN 1 ELSE 0 END, "
            f"attempts = t.attempts - CASE WHEN v.unstarted THEN 1 ELSE 0 END, "
            f"{CLEAR_CLAIM}, updated_at = %s "
            f"FROM unnest(%s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::text[], "
            f"%s::boolean[], %s::boolean[], %s::text[]) AS v(id, token, state, next_at, error, "
            f"snooze, unstarted, trace) WHERE {BATCH_ROW_BY_KEY} "
            f"RETURNING t.id, t.kind, t.state, t.next_at <= %s, t.priority <> 0"
        )
        self.sql_notify_kinds = (
            f"SELECT pg_notify('{NOTIFY_CHANNEL}', kind) FROM unnest(%s::text[]) AS kind "
            f"UNION ALL SELECT pg_notify('{PRIORITY_CHANNEL}', kind) "
            f"FROM unnest(%s::text[]) AS kind"
        )
        # A released or retried-now intent is due now: wake idle pools as an enqueue would.
        self.sql_release = self._notifying(self.sql_release)
        self.sql_retry_now = self._notifying(self.sql_retry_now)

    def _notifying(self, update: str) -> str:
        """``update`` (which returns the kind it moved), then a notification per kind."""
        return (
            f"WITH upd AS ({update}, priority) SELECT kind, pg_notify('{NOTIFY_CHANNEL}', kind), "
            f"CASE WHEN priority <> 0 THEN pg_notify('{PRIORITY_CHANNEL}', kind) END FROM upd"
        )

    def _json_select(self) -> str:
        """The select list of the JSON insert: the batch's time is the first three parameters."""
        fixed = {
            "next_at": "COALESCE(r.next_at, %s)",
            "priority": "COALESCE(r.priority, 0)",
            "trace_context": "COALESCE(r.trace_context, '')",
            "created_at": "%s",
            "updated_at": "%s",
            "state": "'pending'",
            "attempts": "0",
            "snoozes": "0",
            "last_error": "''",
            "last_traceback": "''",
            "claim_token": "''",
            "claim_until": "NULL",
        }
        return ", ".join(fixed.get(column, f"r.{column}") for column in self.columns)

    def insert(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        if len(rows) > 1:
            # One row gains nothing from the JSON form: its VALUES text is short
            # enough for the client to cache, and the server parses no JSON.
            now = rows[0]["created_at"]  # the same for every row of a batch
            statement, params = self.sql_insert_json, [*[self.dt(now)] * 3, _json_rows(rows, now)]
        else:
            statement = self.sql_insert.replace("{rows}", self.values_groups(len(rows)))
            params = to_values(self, rows)
        with self.cursor() as cursor:
            cursor.execute(statement, params)
            return [kind for kind, count, *_ in cursor.fetchall() for _ in range(count)]

    def kind_filter(self, kinds: list[str] | None) -> tuple[str, list[Any]]:
        """``array_position(kinds, kind) IS NOT NULL``, which no index can answer.

        The planner, knowing nothing of what the function returns, takes it to
        keep almost every row, and so walks the claim index in order and stops
        at ``LIMIT``. Written ``kind IN (...)`` it was served by the (kind,
        state) index, which after a churn fetched every dead row version of the
        kind; written ``(kind || '') IN (...)`` it was estimated to keep 0.5 %
        of the rows, and on a vacuumed but never analysed table the planner
        then fetched and sorted every due row. Either way a claim cost as much
        as the backlog.
        """
        if not kinds:
            return "", []
        return " AND array_position(%s::text[], kind::text) IS NOT NULL", [list(kinds)]

    def claim_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, list[Any]]]:
        """One statement: the branches' parameters, then the claim's limit (``sql_claim``)."""
        statement, params = self.branched(self.sql_claim, now=now, filters=filters, tail=[limit])
        return [(statement, [*params, limit])]

    def claim(
        self,
        *,
        now: datetime,
        until: datetime,
        limit: int,
        filters: ClaimFilters,
        complete: list[tuple[str, str]] | None = None,
    ) -> Claims[Claimed]:
        """A limited claim completes ``complete`` in its own round trip (``locked``)."""
        tail = [_salt(), self.dt(until), self.dt(now)]
        riders = Riders(complete or [], at=self.dt(now))
        if filters.limits:
            rows = self.claim_limited(
                now=now, limit=limit, filters=filters, tail=tail, riders=riders
            )
        else:
            if riders.pairs:
                riders.done, riders.sent = self.complete_many(riders.pairs, now=now), True
            rows = Claims(self.claim_by_priority(now=now, limit=limit, filters=filters, tail=tail))
        width = len(self.columns)
        intents = hydrate(self, [row[:width] for row in rows])
        claimed = [
            (intent, row[width + 1] if row[width] == RUNNING else None)
            for intent, row in zip(intents, rows, strict=True)
        ]
        claimed.sort(key=lambda pair: claim_order(pair[0]))
        return rows.carrying(claimed, completed=riders.done)

    def claim_by_priority(
        self, *, now: datetime, limit: int, filters: ClaimFilters, tail: list[Any]
    ) -> list[Any]:
        """A pool's claim above its floor uses the plain statement of priority 0
        while no other priority is due; every other claim walks the three branches.

        The listener says when intents of other priorities are due; so does a
        plain claim that ran out of priority 0 (it took less than it asked
        for, though some), since an intent of another priority may have
        become due by time, which no ``NOTIFY`` announces. The next claim of
        the same kinds then walks the three branches (``sql_claim``); a claim
        of the branches that took no intent of another priority goes back to
        the plain one. The claim that ran out returns at once with what it
        took rather than walk the branches for the room left: an idle pool's
        claim of one new intent does just that, and the second round trip
        was a third of the time from commit to handler. So a pool whose
        queue never uses priorities pays one small index lookup per claim,
        and an intent of a higher priority waits one claim at most; a claim
        without a floor (the manager's, a pool's full scan) always takes the
        exact order.
        """
        key = None if filters.kinds is None else tuple(filters.kinds)
        heard = self._heard
        if filters.since is not None and not self._others_due.get(key, True):
            statement, params = self.zero_claim_query(now=now, limit=limit, filters=filters)
            with self.cursor() as cursor:
                cursor.execute(statement, [*params, *tail])
                rows = cursor.fetchall()
            # Nothing of priority 0 above the floor is an idle pool's poll, which
            # would pay the branches ten times a second for nothing: what the
            # listener has not announced waits for the pool's full claim.
            self.settle_others(key, heard, 0 < len(rows) < limit)
            return rows
        # The statement of claim_queries is the whole claim; its parameters end
        # before the token salt, the lease end and the update time.
        [(statement, params)] = self.claim_queries(now=now, limit=limit, filters=filters)
        with self.cursor() as cursor:
            cursor.execute(statement, [*params, *tail])
            branched = cursor.fetchall()
        priority = self.columns.index("priority")
        self.settle_others(key, heard, any(row[priority] != 0 for row in branched))
        return branched

    def zero_claim_query(
        self, *, now: datetime, limit: int, filters: ClaimFilters, template: str | None = None
    ) -> tuple[str, list[Any]]:
        """``sql_claim_zero`` (or ``template``, which has its placeholders) and its
        parameters, less the token salt, the lease end and the update time."""
        where, params = self.filters(filters)
        floor, floor_params = self.floor(filters)
        at = self.dt(now)
        statement = template or self.sql_claim_zero
        statement = statement.replace("{filters}", where).replace(FLOOR, floor)
        return statement, [at, at, *params, *floor_params, limit]

    def settle_others(self, key: tuple[str, ...] | None, heard: int, due: bool) -> None:
        """Record whether a claim saw intents of other priorities due, unless the
        listener gave a hint while it ran (``heard`` is its count at the start).

        The listener runs in a thread of its own. A claim whose statement began
        before an urgent intent committed did not see it; if its NOTIFY arrived
        meanwhile, clearing the flag would leave that intent to the pool's full
        claim, up to a second later.
        """
        if due or heard == self._heard:
            self._others_due[key] = due

    def others_due(self, kind: str) -> None:
        """Intents of ``kind`` at another priority than 0 became due now (the pool's
        listener heard it on PRIORITY_CHANNEL): the next claims of it walk every branch."""
        self._heard += 1  # first: a claim that reads the count after this sees the flag
        for key in list(self._others_due):
            if key is None or kind in key:
                self._others_due[key] = True

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        with self.cursor() as cursor:
            ids, tokens = [id for id, _ in pairs], [token for _, token in pairs]
            cursor.execute(self.sql_complete_many, [self.dt(now), ids, tokens])
            return [(row[0], row[1]) for row in cursor.fetchall()]

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """One statement over arrays; an intent due now notifies idle pools, as release does."""
        columns: list[list[Any]] = [[], [], [], [], [], [], [], []]
        for e in endings:
            row = (e.id, e.token, e.state, e.next_at, e.error, e.snooze, e.unstarted, e.traceback)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        with self.cursor() as cursor:
            cursor.execute(self.sql_finish_many, [now, *columns, now])
            rows = cursor.fetchall()
            due = [
                (kind, other)
                for _, kind, state, now_due, other in rows
                if state == PENDING and now_due
            ]
            if due:
                prioritized = sorted({kind for kind, other in due if other})
                cursor.execute(self.sql_notify_kinds, [sorted({k for k, _ in due}), prioritized])
        return [(id, kind, state) for id, kind, state, _, _ in rows]


def _salt() -> str:
    """Each claimed row's token is md5(salt || id): unique per claim, one parameter per batch."""
    return secrets.token_hex(16)


def _json_rows(rows: Sequence[dict[str, Any]], now: datetime) -> str:
    """The rows as one JSON array; ``next_at`` only where it is not the batch's ``now``,
    ``priority`` and ``trace_context`` only where they are set."""
    items = []
    for row in rows:
        item = {column: row[column] for column in JSON_COLUMNS[:5]}
        if row["next_at"] is not now:
            item["next_at"] = row["next_at"].isoformat()
        if row["priority"]:
            item["priority"] = row["priority"]
        if row["trace_context"]:
            item["trace_context"] = row["trace_context"]
        items.append(item)
    return json.dumps(items)
