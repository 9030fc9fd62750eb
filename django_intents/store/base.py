"""What every database backend does the same way, and the names each one answers to.

A backend turns one manager call into SQL for its database: the same method
names on every vendor (River's drivers, Django's ``connection.ops``), typed
arguments in, rows or kinds out. Nothing here validates (the manager did) or
sends signals (the manager does, from what these return).

Identifiers come from the model's ``_meta`` through ``quote_name``; values are
always parameters. State names are written as literals on purpose: the
planner must see ``(state = 'pending' OR state = 'running')`` to use the
partial index whose condition says exactly that (``models.Intent.Meta``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.rules.states import State
from django_intents.store.claims import (
    BRANCHES,
    FLOOR,
    Claimed,
    ClaimFilters,
    Claims,
    branches,
    claim_order,
    exclusions,
)
from django_intents.store.endings import (
    CANCEL_SET,
    CLEAR_CLAIM,
    RETRY_NOW_SET,
    Ending,
    Finished,
    finish_by_case,
)
from django_intents.store.limited import claim as limited_claim
from django_intents.store.rows import hydrate, take, to_values

if TYPE_CHECKING:
    from django.db.models import Model


PENDING, RUNNING = State.PENDING.value, State.RUNNING.value
COMPLETED, CANCELLED = State.COMPLETED.value, State.CANCELLED.value
ACTIVE = f"(state = '{PENDING}' OR state = '{RUNNING}')"
# states.due in SQL: a due pending intent, or a running one whose lease ran out.
# The lease test is a negation so that PostgreSQL estimates it as barely
# selective and walks the claim index in order instead of sorting every due row.
DUE = f"{ACTIVE} AND next_at <= %s AND NOT (state = '{RUNNING}' AND claim_until > %s)"
CLAIM_ORDER = "ORDER BY next_at, created_at, id"
# One claimed row by its key. The state is spelled "(state = 'running') IS
# TRUE" so that no planner can match it to the lease index's predicate: from
# statistics that say almost nothing runs (an ANALYZE of a table of pending
# intents), PostgreSQL walked every live lease in that index for each renewal.
FENCE = f"WHERE id = %s AND (state = '{RUNNING}') IS TRUE AND claim_token = %s"
# PostgreSQL's channels: new due work, and of another priority than 0 (wakeup.py).
NOTIFY_CHANNEL, PRIORITY_CHANNEL = "django_intents", "django_intents_priority"
# The largest LIMIT that SQLite, PostgreSQL and MariaDB all accept.
MAX_LIMIT = 2**63 - 1


class Backend:
    """One database's SQL for the intent table; subclasses override what differs.

    A backend is built once per database alias and model, and reads
    ``connections[alias]`` on every call, so one instance serves every thread.
    """

    vendor = ""
    # Whether UPDATE ... RETURNING exists; without it a transition reads the
    # kind back by primary key.
    returning = True
    # Index hints after the table name, where the planner needs one: each branch of
    # the claim (``{index}``: ``claims.Branch.index``), and statements by id lists.
    claim_hint = by_id = ""
    # What a batch of transitions locks its running rows with (``finish_many``).
    lock_running = ""
    # Set by each vendor: the insert that ignores known ids and returns kinds, the
    # due rows, the server's clock in UTC (clock.py), the NOTIFY of kinds made due.
    sql_insert = sql_claim = sql_probe = sql_clock = sql_notify_kinds = ""
    # A claimed intent's token, from one salt per claim (``rows.take``): one
    # expression, where a CASE of a branch per intent took SQLite 8 µs an intent.
    sql_salted = ""
    # Leaves paused kinds out of every claim and due probe, inside the claim's own
    # statement: no query of its own, and the claim keeps its index.
    sql_not_paused = " AND kind NOT IN (SELECT kind FROM {paused})"
    sql_pause = "INSERT INTO {paused} (kind, paused_at) VALUES (%s, %s) ON CONFLICT DO NOTHING"

    def __init__(self, alias: str, model: type[Model]) -> None:
        self.alias = alias
        self.model = model
        q = self.connection.ops.quote_name
        self.table = q(model._meta.db_table)
        self.fields = model._meta.concrete_fields
        self.columns = tuple(str(field.column) for field in self.fields)
        self.column_list = ", ".join(q(column) for column in self.columns)
        meta = model._meta
        self.paused_table = paused = q(
            meta.apps.get_model(meta.app_label, "PausedKind")._meta.db_table
        )
        self.not_paused = self.sql_not_paused.replace("{paused}", paused)
        self.sql_pause = self.sql_pause.replace("{paused}", paused)
        self.sql_resume = f"DELETE FROM {paused} WHERE kind = %s"
        self.sql_paused = f"SELECT kind FROM {paused}"
        # Every one-row transition says which kind it moved (``transition``).
        ret = self.returning_kind = " RETURNING kind" if self.returning else ""
        done = f"{CLEAR_CLAIM}, updated_at = %s"
        self.sql_renew = f"UPDATE {self.table} SET claim_until = %s, updated_at = %s {FENCE}"
        self.sql_complete = f"UPDATE {self.table} SET state = '{COMPLETED}', {done} {FENCE}{ret}"
        self.sql_attempts = f"SELECT attempts, snoozes FROM {self.table} {FENCE}"
        self.sql_retry = (
            f"UPDATE {self.table} SET state = '{PENDING}', next_at = %s, last_error = %s, "
            f"{done} {FENCE}{ret}"
        )
        self.sql_cancel_claim = (
            f"UPDATE {self.table} SET state = '{CANCELLED}', last_error = %s, {done} {FENCE}{ret}"
        )
        self.sql_release = (
            f"UPDATE {self.table} SET state = '{PENDING}', next_at = %s, {done} {FENCE}{ret}"
        )
        self.sql_complete_pending = (
            f"UPDATE {self.table} SET state = '{COMPLETED}', updated_at = %s "
            f"WHERE id = %s AND state = '{PENDING}'{ret}"
        )
        unfinished = f"WHERE id = %s AND {ACTIVE}{ret}"
        self.sql_retry_now = f"UPDATE {self.table} SET {RETRY_NOW_SET} {unfinished}"
        self.sql_cancel = f"UPDATE {self.table} SET {CANCEL_SET} {unfinished}"
        # Expired leases that used the last attempt; {ids} narrows it where needed.
        # Snoozes do not count (``attempts - snoozes``), written as a sum: the
        # columns are unsigned on MySQL, where a subtraction may not go below 0.
        self.sql_exhausted = (
            f"UPDATE {self.table} SET state = '{CANCELLED}', last_error = %s, {done} "
            f"WHERE state = '{RUNNING}' AND claim_until <= %s "
            f"AND attempts >= snoozes + %s{{filters}}{ret}"
        )
        # Whether a claim would find anything: each branch's first due row.
        self.sql_probe = branches(
            f"SELECT * FROM (SELECT 1 AS one FROM {self.table}{self.claim_hint} "
            f"WHERE {DUE} AND {{branch}}{{filters}} LIMIT 1) AS {{name}}"
        )
        self.sql_claim_update = (
            f"UPDATE {self.table}{self.by_id} SET state = '{RUNNING}', attempts = attempts + 1, "
            f"claim_token = {self.sql_salted}, claim_until = %s, updated_at = %s "
            f"WHERE id IN ({{ids}}) AND {ACTIVE}"
            + (" RETURNING id, claim_token" if self.returning else "")
        )

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def cursor(self) -> Any:
        return self.connection.cursor()

    # -- insert ------------------------------------------------------------------

    def insert(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        """Insert new intents, leaving known ids alone; return the kind of each row inserted.

        ``sql_insert`` is the vendor's insert that ignores a known id and
        returns the kind of each row it wrote; ``{rows}`` takes the VALUES groups.
        """
        statement = self.sql_insert.replace("{rows}", self.values_groups(len(rows)))
        with self.cursor() as cursor:
            cursor.execute(statement, to_values(self, rows))
            return [kind for (kind,) in cursor.fetchall()]

    def values_groups(self, count: int) -> str:
        group = "(" + ", ".join(["%s"] * len(self.columns)) + ")"
        return ", ".join([group] * count)

    # -- claim -------------------------------------------------------------------

    def claim(
        self,
        *,
        now: datetime,
        until: datetime,
        limit: int,
        filters: ClaimFilters,
        complete: list[tuple[str, str]] | None = None,
    ) -> Claims[Claimed]:
        """Complete ``complete`` (``claims.Riders``), then claim up to ``limit``
        due intents in claim order, in one transaction. By default the due
        rows are selected (``claim_queries``), then updated by primary key, in
        one write transaction (``write_transaction``) that makes the pair
        atomic against other claimers. ``LIMITS`` take ``limited.py``'s path.
        """
        completed = self.complete_many(complete, now=now) if complete else []
        if filters.limits:
            claims = limited_claim(self, now=now, until=until, limit=limit, filters=filters)
        else:
            with self.write_transaction(), self.cursor() as cursor:
                queries = self.claim_queries(now=now, limit=limit, filters=filters)
                intents = sorted(hydrate(self, self.due_rows(cursor, queries)), key=claim_order)
                claims = Claims(take(self, cursor, intents[:limit], now=now, until=until))
        claims.completed = completed
        return claims

    def due_rows(self, cursor: Any, queries: list[tuple[str, list[Any]]]) -> list[Any]:
        rows: list[Any] = []
        for statement, params in queries:
            cursor.execute(statement, params)
            rows += cursor.fetchall()
        return rows

    def claim_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, list[Any]]]:
        """The statements a claim runs to find its intents; tests ``EXPLAIN`` them.

        By default one: ``sql_claim``, whose ``{filters}`` take the optional conditions.
        """
        return [self.branched(self.sql_claim, now=now, filters=filters, tail=[limit])]

    def branched(
        self,
        statement: str,
        *,
        now: datetime,
        filters: ClaimFilters,
        tail: list[Any],
        paused: bool = True,
    ) -> tuple[str, list[Any]]:
        """``statement``, made of one part per ``BRANCHES`` in order, with its parameters.

        Each part takes the due test's two times, the filters, the floor where
        it has one, then ``tail`` (its limit, where it has one).
        """
        where, params = self.filters(filters, paused=paused)
        floor, floor_params = self.floor(filters)
        at = self.dt(now)
        values: list[Any] = []
        for branch in BRANCHES:
            values += [at, at, *params, *(floor_params if branch.floored else ()), *tail]
        return statement.replace("{filters}", where).replace(FLOOR, floor), values

    def candidate_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, list[Any]]]:
        """What a limited claim (``limited.py``) selects, locking where the database can."""
        return self.claim_queries(now=now, limit=limit, filters=filters)

    @contextlib.contextmanager
    def limit_lock(self, kinds: list[str]) -> Iterator[bool]:
        """A write transaction with no other claim of ``kinds``; yields whether it got one."""
        with self.write_transaction():
            yield True

    def cancel_exhausted(
        self, *, now: datetime, max_attempts: int, kinds: list[str] | None, error: str
    ) -> list[str]:
        """Cancel expired leases that used the last attempt; return their kinds."""
        where, params = self.kind_filter(kinds)
        statement = self.sql_exhausted.replace("{filters}", where)
        at = self.dt(now)
        with self.cursor() as cursor:
            cursor.execute(statement, [error, at, at, max_attempts, *params])
            return [row[0] for row in cursor.fetchall()]

    def has_due(self, *, now: datetime, filters: ClaimFilters) -> bool:
        """Whether a claim at ``now`` would find an intent: one index lookup, no lock."""
        statement, params = self.branched(self.sql_probe, now=now, filters=filters, tail=[])
        with self.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchone() is not None

    def filters(self, filters: ClaimFilters, *, paused: bool = True) -> tuple[str, list[Any]]:
        """The claim's conditions: not paused (unless the statement tests that itself),
        and optionally the kinds, the attempts."""
        where: str = self.not_paused if paused else ""
        params: list[Any] = []
        kinds, kind_params = self.kind_filter(filters.kinds)
        where, params = where + kinds, params + kind_params
        if filters.max_attempts is not None:
            where += f" AND (state = '{PENDING}' OR attempts < snoozes + %s)"
            params.append(filters.max_attempts)
        full, full_params = exclusions(filters)
        return where + full, params + full_params

    def floor(self, filters: ClaimFilters) -> tuple[str, list[Any]]:
        """The claim floor on ``next_at`` (``floor.py``), for the branch of priority 0."""
        if filters.since is None:
            return "", []
        return " AND next_at >= %s", [self.dt(filters.since)]

    def kind_filter(self, kinds: list[str] | None) -> tuple[str, list[Any]]:
        if not kinds:
            return "", []
        return f" AND kind IN ({', '.join(['%s'] * len(kinds))})", list(kinds)

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[None]:
        with transaction.atomic(using=self.alias):
            yield

    # -- fenced transitions: each returns the kinds it moved (none or one) --------

    def renew(self, id: str, token: str, *, now: datetime, until: datetime) -> bool:  # noqa: A002
        with self.cursor() as cursor:
            cursor.execute(self.sql_renew, [self.dt(until), self.dt(now), id, token])
            return bool(cursor.rowcount)

    def complete(self, id: str, token: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition(self.sql_complete, [self.dt(now), id, token], id)

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        """Complete one batch of ``(id, token)`` claims; return ``(id, kind)`` of each completed."""
        raise NotImplementedError

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """Apply a batch of fenced retries, cancellations and releases; return what moved.

        Ids must be distinct. By default: ``endings.finish_by_case``.
        """
        return finish_by_case(self, endings, now=now)

    def attempts(self, id: str, token: str) -> int | None:  # noqa: A002
        """The attempts of a claim still held that count toward ``MAX_ATTEMPTS``
        (its snoozes left out), ``None`` when it is not held."""
        with self.cursor() as cursor:
            cursor.execute(self.sql_attempts, [id, token])
            row = cursor.fetchone()
        return None if row is None else int(row[0]) - int(row[1])

    def retry(
        self,
        id: str,  # noqa: A002
        token: str,
        *,
        now: datetime,
        next_at: datetime,
        error: str,
    ) -> list[str]:
        args = [self.dt(next_at), error, self.dt(now), id, token]
        return self.transition(self.sql_retry, args, id)

    def cancel_claim(self, id: str, token: str, *, now: datetime, error: str) -> list[str]:  # noqa: A002
        return self.transition(self.sql_cancel_claim, [error, self.dt(now), id, token], id)

    def release(self, id: str, token: str, *, now: datetime) -> list[str]:  # noqa: A002
        at = self.dt(now)
        return self.transition(self.sql_release, [at, at, id, token], id)

    # -- unfenced transitions ----------------------------------------------------

    def complete_pending(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition(self.sql_complete_pending, [self.dt(now), id], id)

    def retry_now(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        at = self.dt(now)
        return self.transition(self.sql_retry_now, [at, at, id], id)

    def cancel(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition(self.sql_cancel, [self.dt(now), id], id)

    # -- pauses ------------------------------------------------------------------

    def pause(self, kind: str, *, now: datetime) -> bool:
        with self.cursor() as cursor:
            cursor.execute(self.sql_pause, [kind, self.dt(now)])
            return bool(cursor.rowcount)

    def resume(self, kind: str) -> bool:
        with self.cursor() as cursor:
            cursor.execute(self.sql_resume, [kind])
            return bool(cursor.rowcount)

    def paused(self) -> set[str]:
        with self.cursor() as cursor:
            cursor.execute(self.sql_paused)
            return {kind for (kind,) in cursor.fetchall()}

    # -- plumbing ----------------------------------------------------------------

    def transition(self, statement: str, params: list[Any], id: str) -> list[str]:  # noqa: A002
        """Run a one-row ``UPDATE``; return the kind of the row it changed, if it did."""
        with self.cursor() as cursor:
            cursor.execute(statement, params)
            return [row[0] for row in cursor.fetchall()]

    def dt(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)
