"""What every database backend does the same way, and the names each one answers to.

A backend turns one manager call into its database's named statements
(``sql/<vendor>.sql``, loaded by ``statements.py`` into a ``table.Table``):
the same method names on every vendor (River's drivers, Django's
``connection.ops``), typed arguments in, rows or kinds out. Nothing here
validates (the manager did) or sends signals (the manager does, from what
these return). Python passes parameters and never writes SQL; the only text
that varies per call is a list expanded to as many placeholders as it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.store.claims import (
    Ask,
    Claimed,
    ClaimFilters,
    Claims,
    claim_order,
)
from django_intents.store.endings import Ending, Finished
from django_intents.store.limited import claim as limited_claim
from django_intents.store.memory import ClaimMemory
from django_intents.store.rows import hydrate, take, to_values
from django_intents.store.statements import bind, spread
from django_intents.store.table import Table, claim_params
from django_intents.store.wakeups import POLL, CommitWatch, Listening, Wakeup

if TYPE_CHECKING:
    from django.db.models import Model

# Targets an ``ordered_heads`` statement asks about at most: a column each, and
# SQLite returns at most 2,000 columns.
HEADS_BATCH = 500

# PostgreSQL's channels: new due work, and of another priority than 0 (postgresql/listen.py).
NOTIFY_CHANNEL, PRIORITY_CHANNEL = "django_intents", "django_intents_priority"

__all__ = [
    "NOTIFY_CHANNEL",
    "PRIORITY_CHANNEL",
    "Backend",
    "Ending",
    "Finished",
]


class Backend:
    """One database's statements for the intent table; subclasses override what differs.

    A backend is built once per database alias and model, and reads
    ``connections[alias]`` on every call, so one instance serves every thread.
    """

    vendor = ""
    # Whether UPDATE ... RETURNING exists; without it a transition reads the
    # kind back by primary key.
    returning = True

    def __init__(self, alias: str, model: type[Model]) -> None:
        self.alias = alias
        self.model = model
        self.table = Table(
            alias,
            model,
            vendor=self.vendor,
            returning=self.returning,
            cursor=self.cursor,
            values={"channel": NOTIFY_CHANNEL, "priority_channel": PRIORITY_CHANNEL},
        )
        self.sql = self.table.sql

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def cursor(self) -> Any:
        return self.connection.cursor()

    # -- what a pool may count on ------------------------------------------------

    @property
    def claims_skip_locked(self) -> bool:
        """Whether claims skip the rows other claims lock: then claims and writes
        need not wait for each other, and a second writer may work meanwhile.
        Without it (SQLite: one writer) a pool looks (``has_due``) before it
        claims, so that an idle pool does not take the write lock for nothing."""
        return bool(self.connection.features.has_select_for_update_skip_locked)

    def wakeup(self) -> Wakeup:
        """How a pool can be woken here (``wakeups.py``); by default it polls."""
        return Wakeup(POLL)

    def listen(self, connection: BaseDatabaseWrapper) -> Listening:
        """Listen for new due work on ``connection``, an open one of the listener's own."""
        raise NotSupportedError(f"{self.vendor} has no LISTEN")

    def notify(self, connection: BaseDatabaseWrapper, payload: str) -> None:
        """Send ``payload`` to the listeners through ``connection``, as enqueue notifies."""
        raise NotSupportedError(f"{self.vendor} has no NOTIFY")

    def watch_commits(self, connection: BaseDatabaseWrapper) -> CommitWatch:
        """Watch other connections' commits on ``connection``, an open one of the watch's own."""
        raise NotSupportedError(f"{self.vendor} cannot watch commits")

    def dt(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    # -- insert ------------------------------------------------------------------

    def insert(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        """Insert new intents, leaving known ids alone; return the kind of each row inserted."""
        with self.cursor() as cursor:
            cursor.execute(spread(self.sql.insert, rows=len(rows)), to_values(self.table, rows))
            return [kind for (kind,) in cursor.fetchall()]

    # -- claim -------------------------------------------------------------------

    def claim(
        self,
        *,
        now: datetime,
        until: datetime,
        limit: int,
        filters: ClaimFilters,
        complete: list[tuple[str, str]] | None = None,
        memory: ClaimMemory | None = None,
    ) -> Claims[Claimed]:
        """Complete ``complete`` (``claims.Riders``), then claim up to ``limit``
        due intents in claim order, in one transaction (``claim_asked``);
        ``memory`` is a pool's (``memory.py``)."""
        return self.claim_asked(Ask(now, until, limit, filters, complete or [], memory))

    def claim_asked(self, ask: Ask) -> Claims[Claimed]:
        """By default the due rows are selected (``claim``), then updated by primary
        key (``claim_update``), in one write transaction (``write_transaction``)
        that makes the pair atomic against other claimers. ``LIMITS`` caps, rates
        and ordered kinds take ``limited.py``'s path."""
        now, until, limit, filters = ask.now, ask.until, ask.limit, ask.filters
        completed = self.complete_many(ask.complete, now=now) if ask.complete else []
        if filters.limited:
            claims = limited_claim(
                self.table,
                lock=self.limit_lock,
                scan=self.scan,
                ordered=self,
                now=now,
                until=until,
                limit=limit,
                filters=filters,
            )
        else:
            with self.write_transaction(), self.cursor() as cursor:
                rows = self.scan(cursor, now, limit, filters)
                intents = sorted(hydrate(self.table, rows), key=claim_order)
                claims = Claims(take(self.table, cursor, intents[:limit], now=now, until=until))
        claims.completed = completed
        return claims

    def scan(self, cursor: Any, now: datetime, limit: int, filters: ClaimFilters) -> list[Any]:
        """The due rows the claim statement finds (and locks, where the database can)."""
        rows: list[Any] = []
        for statement, params in self.scan_queries(now=now, limit=limit, filters=filters):
            cursor.execute(statement, params)
            rows += cursor.fetchall()
        return rows

    def claim_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, Any]]:
        """The statements a claim runs to find its intents, bound; tests ``EXPLAIN`` them."""
        return [bind(self.sql.claim, self.claim_params(now=now, limit=limit, filters=filters))]

    def scan_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, Any]]:
        """What ``scan`` runs, bound: the claim statement, where it selects (and locks)."""
        return self.claim_queries(now=now, limit=limit, filters=filters)

    def ordered_heads(
        self, cursor: Any, pairs: list[tuple[str, str]]
    ) -> dict[tuple[str, str], str]:
        """The head of each ordered (kind, target) of ``pairs`` (``limited.py``): the id of
        its oldest intent pending or running. ``HEADS_BATCH`` pairs a statement."""
        head_of: dict[tuple[str, str], str] = {}
        for start in range(0, len(pairs), HEADS_BATCH):
            batch = pairs[start : start + HEADS_BATCH]
            asked = [self.head_params(*pair) for pair in batch]
            [found] = self.table.execute(cursor, "ordered_heads", pairs=asked).fetchall()
            head_of.update((pair, id) for pair, id in zip(batch, found, strict=True) if id)
        return head_of

    def head_params(self, kind: str, target: str) -> tuple[str, ...]:
        """What ``ordered_heads`` takes for one target, in its order."""
        return (kind, target)

    def due_by_id(
        self, cursor: Any, now: datetime, ids: list[str], filters: ClaimFilters
    ) -> list[Any]:
        """The rows of ``ids`` a claim may take at ``now``, locked where the database can."""
        params = self.claim_params(now=now, filters=filters)
        rows: list[Any] = self.table.execute(cursor, "due_by_id", **params, ids=ids).fetchall()
        return rows

    def candidate_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, Any]]:
        """What a limited claim (``limited.py``) selects, locking where the database can."""
        return self.claim_queries(now=now, limit=limit, filters=filters)

    def claim_params(
        self, *, now: datetime, filters: ClaimFilters, limit: int | None = None
    ) -> dict[str, Any]:
        return claim_params(self.table, now=now, filters=filters, limit=limit)

    @contextlib.contextmanager
    def limit_lock(self, kinds: list[str]) -> Iterator[bool]:
        """A write transaction with no other claim of ``kinds``; yields whether it got one."""
        with self.write_transaction():
            yield True

    def cancel_exhausted(
        self, *, now: datetime, max_attempts: int, kinds: list[str] | None, error: str
    ) -> list[str]:
        """Cancel expired leases that used the last attempt; return their kinds."""
        rows = self.table.run("exhausted", **self.exhausted_params(now, max_attempts, kinds, error))
        return [row[0] for row in rows]

    def exhausted_params(
        self, now: datetime, max_attempts: int, kinds: list[str] | None, error: str
    ) -> dict[str, Any]:
        return {
            "now": self.dt(now),
            "max_attempts": max_attempts,
            "every_kind": not kinds,
            "kinds": list(kinds or ()),
            "error": error,
        }

    def has_due(self, *, now: datetime, filters: ClaimFilters) -> bool:
        """Whether a claim at ``now`` would find an intent: one index lookup, no lock."""
        statement, params = bind(self.sql.probe, self.claim_params(now=now, filters=filters))
        with self.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchone() is not None

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[None]:
        with transaction.atomic(using=self.alias):
            yield

    # -- fenced transitions: each returns the kinds it moved (none or one) --------

    def renew(self, id: str, token: str, *, now: datetime, until: datetime) -> bool:  # noqa: A002
        return bool(
            self.table.count("renew", until=self.dt(until), now=self.dt(now), id=id, token=token)
        )

    def complete(self, id: str, token: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition("complete", id, now=self.dt(now), token=token)

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        """Complete one batch of ``(id, token)`` claims; return ``(id, kind)`` of each completed."""
        raise NotImplementedError

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """Apply a batch of fenced retries, cancellations and releases; return what moved.

        Ids must be distinct."""
        raise NotImplementedError

    def attempts(self, id: str, token: str) -> int | None:  # noqa: A002
        """The attempts of a claim still held that count toward ``MAX_ATTEMPTS``
        (its snoozes and written-off attempts left out), ``None`` when it is not held."""
        rows = self.table.run("attempts", id=id, token=token)
        return None if not rows else int(rows[0][0]) - int(rows[0][1])

    def retry(
        self,
        id: str,  # noqa: A002
        token: str,
        *,
        now: datetime,
        next_at: datetime,
        error: str,
    ) -> list[str]:
        at = self.dt(now)
        return self.transition(
            "retry", id, next_at=self.dt(next_at), error=error, now=at, token=token
        )

    def cancel_claim(self, id: str, token: str, *, now: datetime, error: str) -> list[str]:  # noqa: A002
        return self.transition("cancel_claim", id, error=error, now=self.dt(now), token=token)

    def release(self, id: str, token: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition("release", id, now=self.dt(now), token=token)

    # -- unfenced transitions ----------------------------------------------------

    def complete_pending(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition("complete_pending", id, now=self.dt(now))

    def retry_now(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition("retry_now", id, now=self.dt(now))

    def cancel(self, id: str, *, now: datetime) -> list[str]:  # noqa: A002
        return self.transition("cancel", id, now=self.dt(now))

    # -- pauses ------------------------------------------------------------------

    def pause(self, kind: str, *, now: datetime) -> bool:
        return bool(self.table.count("pause", kind=kind, now=self.dt(now)))

    def resume(self, kind: str) -> bool:
        return bool(self.table.count("resume", kind=kind))

    def paused(self) -> set[str]:
        return {kind for (kind,) in self.table.run("paused")}

    # -- the admin ---------------------------------------------------------------

    def estimate_rows(self, union: str, params: list[Any], count: int) -> list[int] | None:
        """The planner's row estimate of each of the ``count`` SELECTs of ``union``
        (``admin.estimates``); ``None`` where the planner keeps no row counts (SQLite)."""
        return None

    # -- plumbing ----------------------------------------------------------------

    def transition(self, name: str, id: str, **params: Any) -> list[str]:  # noqa: A002
        """Run the one-row ``UPDATE`` ``name``; return the kind of the row it changed, if it did."""
        return [row[0] for row in self.table.run(name, id=id, **params)]
