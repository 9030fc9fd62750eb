"""Every raw statement of django-intents, per database vendor.

Identifiers come from ``Intent._meta`` through ``connection.ops.quote_name``;
values are always parameters. State names are written as literals on purpose:
the planner must see ``(state = 'pending' OR state = 'running')`` to use the
partial index whose condition says exactly that.

On PostgreSQL with psycopg 3 the statements go out through ``cursor()``, with
the parameters bound by the server, not spliced into the text by the client.

PostgreSQL claims in one statement. SQLite and MariaDB select, then update by
primary key: SQLite inside ``BEGIN IMMEDIATE`` (one writer, so the pair is
atomic), MariaDB under ``FOR UPDATE SKIP LOCKED`` row locks (it has no
``UPDATE ... RETURNING``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

NOTIFY_CHANNEL = "django_intents"

ACTIVE = "(state = 'pending' OR state = 'running')"
# A pending intent that is due, or a running one whose lease has run out. The
# lease test is written as a negation so that PostgreSQL estimates it as barely
# selective and walks the claim index in order instead of sorting every due row.
DUE = ACTIVE + " AND next_at <= %s AND NOT (state = 'running' AND claim_until > %s)"
# MariaDB has no partial index: DUE is asked as two index range scans instead.
DUE_BRANCHES = ("state = 'pending' AND next_at <= %s", "state = 'running' AND claim_until <= %s")
CLAIM_ORDER = "ORDER BY next_at, created_at, id"
CLEAR_CLAIM = "claim_token = '', claim_until = NULL"
FENCE = "WHERE id = %s AND state = 'running' AND claim_token = %s"


@dataclass(frozen=True)
class Statements:
    vendor: str
    table: str
    columns: tuple[str, ...]
    returning: bool  # UPDATE ... RETURNING exists
    insert: str  # {rows} is replaced by one "(%s, ...)" group per row
    insert_json: str  # PostgreSQL: the whole batch as one JSON array parameter
    claim_pg: str  # {filters} takes the optional kind / attempts conditions
    claim_select: str
    claim_expired: str  # MariaDB only: the running branch of claim_select
    lock: str
    renew: str
    complete: str
    complete_many: str  # PostgreSQL: arrays; SQLite: {ids} and {pairs}; MariaDB: {ids}
    complete_many_lock: str  # MariaDB: lock the running rows among {ids} before completing
    due_probe: str  # {filters}; MariaDB: {branch} is the pending or the expired condition
    attempts_of: str
    retry: str
    cancel_claim: str
    complete_pending: str
    retry_now: str
    release: str
    cancel: str
    exhausted_select: str
    exhausted_cancel: str
    kind_of: str

    def values_group(self) -> str:
        return "(" + ", ".join(["%s"] * len(self.columns)) + ")"


def _build(connection: BaseDatabaseWrapper) -> Statements:
    from .models import Intent

    q = connection.ops.quote_name
    vendor = connection.vendor
    table = q(Intent._meta.db_table)
    columns = tuple(str(field.column) for field in Intent._meta.concrete_fields)
    cols = ", ".join(q(c) for c in columns)
    returning = vendor in ("postgresql", "sqlite")
    ret_kind = " RETURNING kind" if returning else ""

    if vendor == "postgresql":
        # Inserted rows notify idle workers; NOTIFY is delivered at commit and
        # dropped on rollback, which is exactly the outbox promise.
        # One notification and one result row per kind, not per intent.
        notify_kinds = (
            f"SELECT kind, count(*), pg_notify('{NOTIFY_CHANNEL}', kind) FROM ins GROUP BY kind"
        )
        insert = (
            f"WITH ins AS (INSERT INTO {table} ({cols}) VALUES {{rows}} "
            f"ON CONFLICT (id) DO NOTHING RETURNING kind) {notify_kinds}"
        )
        # The same insert with the varying columns of every row in one JSON
        # array: a short statement whose text never changes with the batch
        # size, so the client parses it once, and one parameter to adapt
        # instead of thirteen per row. A JSON null payload becomes SQL NULL,
        # as it does through the VALUES form. The batch's own time is one
        # parameter; a row carries next_at only when it was given one.
        varying = (
            "id text, kind text, event_id text, target text, payload jsonb, next_at timestamptz"
        )
        insert_json = (
            f"WITH ins AS (INSERT INTO {table} ({cols}) "
            f"SELECT {_json_select(columns)} FROM jsonb_to_recordset(%s::jsonb) AS r({varying}) "
            f"ON CONFLICT (id) DO NOTHING RETURNING kind) {notify_kinds}"
        )
        retry_now_sql = (
            f"WITH upd AS (UPDATE {table} SET state = 'pending', next_at = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s WHERE id = %s AND {ACTIVE} RETURNING kind) "
            f"SELECT kind, pg_notify('{NOTIFY_CHANNEL}', kind) FROM upd"
        )
        # A released intent is due now: wake idle pools as an enqueue would.
        release_sql = (
            f"WITH upd AS (UPDATE {table} SET state = 'pending', next_at = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s {FENCE} RETURNING kind) "
            f"SELECT kind, pg_notify('{NOTIFY_CHANNEL}', kind) FROM upd"
        )
    else:
        insert_json = ""
    if vendor == "sqlite":
        insert = (
            f"INSERT INTO {table} ({cols}) VALUES {{rows}} "
            f"ON CONFLICT (id) DO NOTHING RETURNING kind"
        )
    elif vendor != "postgresql":
        # IGNORE is safe here: every value was validated before, so the only
        # error it can swallow is the duplicate key that makes enqueue idempotent.
        insert = f"INSERT IGNORE INTO {table} ({cols}) VALUES {{rows}} RETURNING kind"
    if vendor != "postgresql":
        retry_now_sql = (
            f"UPDATE {table} SET state = 'pending', next_at = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s WHERE id = %s AND {ACTIVE}{ret_kind}"
        )
        release_sql = (
            f"UPDATE {table} SET state = 'pending', next_at = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s {FENCE}{ret_kind}"
        )

    # The inner SELECT is the fence between claimers: it locks the rows it
    # picks and skips rows another claimer has locked, so concurrent claims
    # never see the same intent. MATERIALIZED keeps it from being inlined and
    # evaluated more than once.
    claim_pg = (
        f"WITH due AS MATERIALIZED (SELECT id, state AS was, claim_until AS lease_end "
        f"FROM {table} WHERE {DUE}{{filters}} {CLAIM_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {table} AS t SET state = 'running', attempts = t.attempts + 1, "
        f"claim_token = md5(%s || t.id), claim_until = %s, updated_at = %s "
        f"FROM due WHERE t.id = due.id "
        f"RETURNING {', '.join('t.' + q(c) for c in columns)}, due.was, due.lease_end"
    )
    lock = " FOR UPDATE SKIP LOCKED" if vendor == "mysql" else ""
    if vendor == "mysql":
        # No partial indexes: state leads the index, so each branch is an
        # ordered range scan; the two branches are merged in Python.
        claim_select = (
            f"(SELECT {cols} FROM {table} WHERE state = 'pending' AND next_at <= %s{{filters}} "
            f"{CLAIM_ORDER} LIMIT %s{lock})"
        )
        claim_expired = (
            f"(SELECT {cols} FROM {table} WHERE state = 'running' AND claim_until <= %s{{filters}} "
            f"{CLAIM_ORDER} LIMIT %s{lock})"
        )
    else:
        # Without ANALYZE statistics SQLite may prefer the (state, updated_at)
        # index and sort; INDEXED BY pins the claim to the partial index.
        hint = " INDEXED BY intents_claimable_idx" if vendor == "sqlite" else ""
        claim_select = (
            f"SELECT {cols} FROM {table}{hint} WHERE {DUE}{{filters}} {CLAIM_ORDER} LIMIT %s"
        )
        claim_expired = ""

    done = f"state = 'completed', {CLEAR_CLAIM}, updated_at = %s"
    complete_many_lock = ""
    if vendor == "postgresql":
        # Arrays keep the statement text the same whatever the batch size.
        complete_many = (
            f"UPDATE {table} AS t SET {done} "
            f"FROM unnest(%s::text[], %s::text[]) AS v(id, token) "
            f"WHERE t.id = v.id AND t.state = 'running' AND t.claim_token = v.token "
            f"RETURNING t.id, t.kind"
        )
    elif vendor == "sqlite":
        complete_many = (
            # The id list steers SQLite to the primary key rather than a scan
            # of every running row; the pairs are the fence.
            f"UPDATE {table} SET {done} WHERE id IN ({{ids}}) AND state = 'running' "
            f"AND (id, claim_token) IN (VALUES {{pairs}}) RETURNING id, kind"
        )
    else:
        # No RETURNING on UPDATE: lock the candidates, keep those whose token
        # matches, then complete exactly those while the locks are held.
        complete_many_lock = (
            f"SELECT id, kind, claim_token FROM {table} "
            f"WHERE id IN ({{ids}}) AND state = 'running' FOR UPDATE"
        )
        complete_many = f"UPDATE {table} SET {done} WHERE id IN ({{ids}}) AND state = 'running'"
    if vendor == "mysql":
        due_probe = f"SELECT 1 FROM {table} WHERE {{branch}}{{filters}} LIMIT 1"
    else:
        hint = " INDEXED BY intents_claimable_idx" if vendor == "sqlite" else ""
        due_probe = f"SELECT 1 FROM {table}{hint} WHERE {DUE}{{filters}} LIMIT 1"

    return Statements(
        vendor=vendor,
        table=table,
        columns=columns,
        returning=returning,
        insert=insert,
        insert_json=insert_json,
        claim_pg=claim_pg,
        claim_select=claim_select,
        claim_expired=claim_expired,
        lock=lock,
        renew=f"UPDATE {table} SET claim_until = %s, updated_at = %s {FENCE}",
        complete=(
            f"UPDATE {table} SET state = 'completed', {CLEAR_CLAIM}, updated_at = %s "
            f"{FENCE}{ret_kind}"
        ),
        complete_many=complete_many,
        complete_many_lock=complete_many_lock,
        due_probe=due_probe,
        attempts_of=f"SELECT attempts, kind FROM {table} {FENCE}",
        retry=(
            f"UPDATE {table} SET state = 'pending', next_at = %s, last_error = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s {FENCE}{ret_kind}"
        ),
        cancel_claim=(
            f"UPDATE {table} SET state = 'cancelled', last_error = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s {FENCE}{ret_kind}"
        ),
        complete_pending=(
            f"UPDATE {table} SET state = 'completed', updated_at = %s "
            f"WHERE id = %s AND state = 'pending'{ret_kind}"
        ),
        retry_now=retry_now_sql,
        release=release_sql,
        cancel=(
            f"UPDATE {table} SET state = 'cancelled', {CLEAR_CLAIM}, updated_at = %s "
            f"WHERE id = %s AND {ACTIVE}{ret_kind}"
        ),
        exhausted_select=(
            f"SELECT id, kind FROM {table} WHERE state = 'running' AND claim_until <= %s "
            f"AND attempts >= %s{{filters}}{lock}"
        ),
        # {where} is the exhausted condition (PostgreSQL, SQLite) or an id list (MariaDB).
        exhausted_cancel=(
            f"UPDATE {table} SET state = 'cancelled', last_error = %s, {CLEAR_CLAIM}, "
            f"updated_at = %s WHERE state = 'running' AND claim_until <= %s {{where}}{ret_kind}"
        ),
        kind_of=f"SELECT kind FROM {table} WHERE id = %s",
    )


JSON_COLUMNS = ("id", "kind", "event_id", "target", "payload", "next_at")


def _json_select(columns: tuple[str, ...]) -> str:
    """The select list of ``insert_json``: row values from JSON, the rest fixed for a new intent.

    The statement takes the batch's ``now`` first (``JSON_NOW_PARAMS`` times),
    then the JSON array.
    """
    fixed = {
        "next_at": "COALESCE(r.next_at, %(now)s)",
        "created_at": "%(now)s",
        "updated_at": "%(now)s",
        "state": "'pending'",
        "attempts": "0",
        "last_error": "''",
        "claim_token": "''",
        "claim_until": "NULL",
    }
    select = [fixed.get(c, f"r.{c}") for c in columns]
    return ", ".join(select).replace("%(now)s", "%s")


JSON_NOW_PARAMS = 3  # next_at's default, created_at and updated_at


@functools.cache
def _cached(vendor: str, alias: str, table: str) -> Statements:
    from django.db import connections

    return _build(connections[alias])


def statements(connection: BaseDatabaseWrapper) -> Statements:
    """Return the statements for ``connection``'s vendor, built once per alias."""
    from .models import Intent

    return _cached(connection.vendor, connection.alias, Intent._meta.db_table)


def cursor(connection: BaseDatabaseWrapper) -> Any:
    """A cursor for these statements: on psycopg 3, one whose parameters the server binds.

    Django binds parameters on the client by default, so every statement is
    new text that the server parses and plans again, and psycopg spends more
    time composing it than sending it. These statements are written to be
    bound by the server (``%s`` only where a value goes), which made a single
    ``enqueue`` about a third faster on PostgreSQL (docs/benchmarks.md).
    Statements are still not prepared unless ``OPTIONS["prepare_threshold"]``
    says so, so connection poolers keep working. The cursor is wrapped like
    Django's own, so query logging and ``execute_wrapper`` see every statement.
    """
    if connection.vendor != "postgresql" or not _psycopg3(connection):
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def _psycopg3(connection: BaseDatabaseWrapper) -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def in_list(column: str, count: int) -> str:
    """Return ``column IN (%s, ...)`` for ``count`` parameters."""
    return f"{column} IN ({', '.join(['%s'] * count)})"


def kind_filter(kinds: list[str] | None, vendor: str = "") -> tuple[str, list[Any]]:
    """``AND kind IN (...)`` for a claim or a due probe; nothing when ``kinds`` is empty.

    On PostgreSQL the test is written ``array_position(kinds, kind) IS NOT
    NULL``. No index can answer that, and the planner, which knows nothing of
    what the function returns, takes it to keep almost every row. Written as
    ``kind IN (...)`` it was served by the (kind, state) index, which after a
    churn fetched every dead row version of the kind; written ``(kind || '')
    IN (...)`` it was estimated to keep 0.5 % of the rows, and on a table that
    had been vacuumed but never analysed the planner then fetched and sorted
    every due row instead of walking the claim index in order. Either way a
    claim cost as much as the backlog; walked in order it stops at ``LIMIT``.
    """
    if not kinds:
        return "", []
    if vendor == "postgresql":
        return " AND array_position(%s::text[], kind::text) IS NOT NULL", [list(kinds)]
    return " AND " + in_list("kind", len(kinds)), list(kinds)
