"""PostgreSQL: a claim is one statement, and a new or re-queued intent notifies idle pools.

Statements go out through psycopg 3's server-side binding (``cursor()``), so
the server parses each text once per connection however the values change.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.rules.states import State
from django_intents.store.base import Backend, Ending, Finished
from django_intents.store.claims import Ask, Claimed, ClaimFilters, Claims, Riders, claim_order
from django_intents.store.memory import ClaimMemory
from django_intents.store.postgresql import listen
from django_intents.store.postgresql.cursors import server_cursor
from django_intents.store.postgresql.days import Days
from django_intents.store.postgresql.limited import LimitedClaims, lock_key
from django_intents.store.rows import hydrate
from django_intents.store.statements import bind
from django_intents.store.wakeups import LISTEN, POLL, Listening, Wakeup

# The columns a new intent takes from its caller; the rest are fixed or the batch's time.
JSON_COLUMNS = ("id", "kind", "event_id", "target", "payload", "next_at", "priority")
PENDING, RUNNING = State.PENDING.value, State.RUNNING.value


class PostgreSQLBackend(Backend):
    """PostgreSQL's statements are ``sql/postgresql.sql``; a pool's claims choose
    among them by what its ``ClaimMemory`` holds."""

    vendor = "postgresql"

    def __init__(self, alias: str, model: Any) -> None:
        super().__init__(alias, model)
        self.limited = LimitedClaims(self.table)
        self.days = Days(self.table)

    def cursor(self) -> Any:
        """A cursor whose parameters the server binds (``cursors.server_cursor``)."""
        return server_cursor(self.alias)

    def wakeup(self) -> Wakeup:
        """``LISTEN`` (``listen.py``), where the driver can receive notifications."""
        if listen.supported():
            return Wakeup(LISTEN)
        return Wakeup(POLL, "LISTEN/NOTIFY needs psycopg >= 3.2")

    def listen(self, connection: BaseDatabaseWrapper) -> Listening:
        return listen.Session(connection, self.sql)

    def notify(self, connection: BaseDatabaseWrapper, payload: str) -> None:
        listen.notify(connection, self.sql, payload)

    def insert(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        """Rows go as one JSON array (``insert``): a text that never changes,
        which also writes each id's key and looks for a known one's row."""
        with self.cursor() as cursor:
            now = rows[0]["created_at"]  # the same for every row of a batch
            rows_json = _json_rows(rows, now)
            self.table.execute(cursor, "insert", now=self.dt(now), rows=rows_json)
            return [kind for kind, count, *_ in cursor.fetchall() for _ in range(count)]

    def claim_queries(
        self,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        tail: Mapping[str, Any] | None = None,
    ) -> list[tuple[str, Any]]:
        """The claim of every priority (``claim``), bound; ``tail`` gives the token
        salt and the lease end (an EXPLAIN may go without)."""
        params = self.claim_params(now=now, limit=limit, filters=filters)
        return [bind(self.sql.claim, {**params, **(tail or {})})]

    def zero_claim_query(
        self,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        tail: Mapping[str, Any] | None = None,
    ) -> tuple[str, Any]:
        """The claim of priority 0 alone (``claim_zero``), bound as ``claim_queries``'s."""
        params = self.claim_params(now=now, limit=limit, filters=filters)
        return bind(self.sql.claim_zero, {**params, **(tail or {})})

    def claim_asked(self, ask: Ask) -> Claims[Claimed]:
        """A limited claim completes ``ask.complete`` in its own round trip (``locked``).
        A claim without a memory learns into one of its own, which it forgets.
        A claim of kinds with a ``rate``, a learned pace or ``"ordered": True`` takes the portable
        limited claim (``limited.py``, with ``scan`` and ``limit_lock``): the starts
        it counts and writes, and the heads it looks up, leave the exact statements
        of ``LIMITS`` as they are."""
        if ask.filters.rates or ask.filters.paces or ask.filters.ordered:
            return super().claim_asked(ask)
        tail = {"salt": _salt(), "until": self.dt(ask.until)}
        # The day's partition is looked up (made, once a day) only for completions to move.
        into = self.days.into(self.days.today(ask.now)) if ask.complete else {}
        riders = Riders(ask.complete, at=self.dt(ask.now), into=into)
        memory = ClaimMemory() if ask.memory is None else ask.memory
        if ask.filters.limits:
            rows = self.limited.claim(ask, tail, memory, riders)
        else:
            if riders.pairs:
                riders.done, riders.sent = self.complete_many(riders.pairs, now=ask.now), True
            rows = Claims(self.claim_by_priority(ask, tail, memory))
        width = len(self.table.columns)
        intents = hydrate(self.table, [row[:width] for row in rows])
        claimed = [
            (intent, row[width + 1] if row[width] == RUNNING else None)
            for intent, row in zip(intents, rows, strict=True)
        ]
        claimed.sort(key=lambda pair: claim_order(pair[0]))
        return rows.carrying(claimed, completed=riders.done)

    def claim_by_priority(self, ask: Ask, tail: dict[str, Any], memory: ClaimMemory) -> list[Any]:
        """A pool's claim above its floor uses the plain statement of priority 0
        while no other priority is due; every other claim walks the three branches.

        The listener says when intents of other priorities are due; so does a
        plain claim that ran out of priority 0 (it took less than it asked
        for, though some), since an intent of another priority may have
        become due by time, which no ``NOTIFY`` announces. The next claim of
        the same kinds then walks the three branches (``claim``); a claim
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
        now, limit, filters = ask.now, ask.limit, ask.filters
        key = None if filters.kinds is None else tuple(filters.kinds)
        heard = memory.heard
        if filters.since is not None and not memory.others_due.get(key, True):
            query = self.zero_claim_query(now=now, limit=limit, filters=filters, tail=tail)
            with self.cursor() as cursor:
                cursor.execute(*query)
                rows: list[Any] = cursor.fetchall()
            # Nothing of priority 0 above the floor is an idle pool's poll, which
            # would pay the branches ten times a second for nothing: what the
            # listener has not announced waits for the pool's full claim.
            memory.settle_others(key, heard, 0 < len(rows) < limit)
            return rows
        # The statement of claim_queries is the whole claim.
        [query] = self.claim_queries(now=now, limit=limit, filters=filters, tail=tail)
        with self.cursor() as cursor:
            cursor.execute(*query)
            branched: list[Any] = cursor.fetchall()
        priority = self.table.columns.index("priority")
        memory.settle_others(key, heard, any(row[priority] != 0 for row in branched))
        return branched

    @contextlib.contextmanager
    def limit_lock(self, kinds: list[str]) -> Iterator[bool]:
        """The kinds' advisory locks for the transaction, those of the exact limited
        claim (``limited.lock_key``, in the same order): both kinds of claim
        of a kind wait for each other."""
        keys = sorted(lock_key(kind) for kind in kinds)
        with self.write_transaction(), self.cursor() as cursor:
            self.table.execute(cursor, "limit_lock_only", keys=keys).fetchall()
            yield True

    def scan_queries(
        self, *, now: datetime, limit: int, filters: ClaimFilters
    ) -> list[tuple[str, Any]]:
        """The portable limited claim's scan: the claim statement here updates as it selects."""
        return [self.scan_query(now=now, limit=limit, filters=filters)]

    def scan_query(self, *, now: datetime, limit: int, filters: ClaimFilters) -> tuple[str, Any]:
        """``scan`` bound: the full targets go as two arrays, their kinds and their
        targets, so that the text never changes."""
        params = self.claim_params(now=now, limit=limit, filters=filters)
        params["ft_kinds"] = [kind for kind, _ in filters.full_targets]
        params["ft_targets"] = [target for _, target in filters.full_targets]
        return bind(self.sql.scan, params)

    def ordered_heads(
        self, cursor: Any, pairs: list[tuple[str, str]]
    ) -> dict[tuple[str, str], str]:
        """One statement over arrays, whatever the number of targets."""
        kinds, targets = [kind for kind, _ in pairs], [target for _, target in pairs]
        self.table.execute(cursor, "ordered_heads", kinds=kinds, targets=targets)
        return {(kind, target): id for kind, target, id in cursor.fetchall()}

    def candidate_queries(self, **query: Any) -> list[tuple[str, Any]]:
        """The exact limited claim (``LimitedClaims.candidate_queries``)."""
        return self.limited.candidate_queries(**query)

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        """Completed intents move out of the live partition at once, into their day's."""
        ids, tokens = [id for id, _ in pairs], [token for _, token in pairs]
        day = self.days.today(now)
        rows = self.table.run(
            "complete_many", now=self.dt(now), ids=ids, tokens=tokens, **self.days.into(day)
        )
        if not all(moved for _, _, moved in rows):
            self.days.forget(day)  # its partition went: made again by the next batch
        return [(row[0], row[1]) for row in rows]

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """One statement over arrays; an intent due now notifies idle pools, as release does."""
        arrays = {
            "ids": [e.id for e in endings],
            "tokens": [e.token for e in endings],
            "states": [e.state for e in endings],
            "next_ats": [e.next_at for e in endings],
            "errors": [e.error for e in endings],
            "tracebacks": [e.traceback for e in endings],
            "snoozed": [e.snooze for e in endings],
            "unstarted": [e.unstarted for e in endings],
        }
        with self.cursor() as cursor:
            rows = self.table.execute(cursor, "finish_many", now=now, **arrays).fetchall()
            due = [
                (kind, other)
                for _, kind, state, now_due, other in rows
                if state == PENDING and now_due
            ]
            if due:
                prioritized = sorted({kind for kind, other in due if other})
                kinds = sorted({kind for kind, _ in due})
                self.table.execute(cursor, "notify_kinds", kinds=kinds, prioritized=prioritized)
        return [(id, kind, state) for id, kind, state, _, _ in rows]

    def estimate_rows(self, union: str, params: list[Any], count: int) -> list[int] | None:
        """The row estimate of each branch of ``union``: the children of its ``Append``.

        One query's estimate is its plan's top row count, parallel or not. Of
        several, a parallel plan would give some branches' rows per worker, so
        that plan is made without workers (``serial_plans``, in a transaction of
        its own, which a pooler in transaction mode keeps on one server
        connection). Through Django's cursor: the text is the ORM's.
        """
        explain = f"EXPLAIN (FORMAT JSON) {union}"
        with self.connection.cursor() as cursor:
            if count == 1:
                cursor.execute(explain, params)
                (plan,) = cursor.fetchone()
            else:
                with transaction.atomic(using=self.alias):
                    cursor.execute(self.sql.serial_plans)
                    cursor.execute(explain, params)
                    (plan,) = cursor.fetchone()
                    cursor.execute(self.sql.parallel_plans)
        node = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
        if count == 1:
            return [int(node["Plan Rows"])]
        while node["Node Type"] != "Append":  # a Result or the like above it
            (node,) = node["Plans"]
        return [int(branch["Plan Rows"]) for branch in node["Plans"]]


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
