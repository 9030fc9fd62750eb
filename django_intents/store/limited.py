"""The claim of kinds that have ``LIMITS``: one at a time per kind, counted, admitted in order.

Two pools that each count the live leases of a kind and then claim could
both see room for the last slot and both take it. So a limited claim first
takes a lock that only the claims of that kind take (``limit_lock``: an
advisory lock for the transaction on PostgreSQL, a named lock on MariaDB,
the one write lock SQLite has anyway), then, in the same transaction:

1. counts the live leases of the limited kinds per target (an expired lease
   is not live: a dead pool's slots free themselves when its leases run out);
2. scans the due intents in claim order, leaving out the kinds and targets
   that have no room at all, so that a dead target's backlog at the head of
   the queue does not hide the intents behind it;
3. admits, in that order, each intent that still fits (``limits.Admission``)
   and claims those by primary key; the rest stay pending, in their place.

Completions, retries and releases take no lock: they only free slots, and a
claim that counted a slot a moment before it freed just takes one fewer.
Kinds without limits claimed in the same call are admitted as they come.

Ordered kinds (SPEC §14, ``"ordered": True``) take this path on every
database. To the count they have a ``per_target`` of 1, so a target whose
head runs is left out of the scan. For the ordered targets among the due
intents the scan finds, the table names each one's head, the oldest intent
pending or running (``Ordered.ordered_heads``: the first entry of the target in the
index of migration 0015); only a head may start (``limits.heads``). A head
the scan did not reach, a retry due after the intents behind it, is read by
its key if it is due (``Ordered.due_by_id``). A target whose head is not due
(snoozed, or retrying later) waits: the claim scans again without it, at
most ``ROUNDS`` times, so that the backlogs of waiting targets at the front
of the queue do not hide the others. Each round claims what it admitted
before the next scans, which then does not see it as due.

Kinds with a ``rate`` (SPEC §14) take this path on every database, under the
same lock: step 1 also counts each rated target's starts inside its window
(``TargetStart``, ``rate_starts``), a target with none left is left out of
the scan like a full one, and each intent taken of a rated kind is written
down as a start (``rate_record``), the starts older than twice the longest
window pruned (``rate_prune``). A claim is a start: an expired lease's
re-claim counts too. The lock makes count-then-record atomic across every
pool. The claim says when the first spent target's window reopens
(``Claims.next_start``), whether or not intents of it wait: a pool woken
for nothing finds nothing to take, and sleeps again.

A target whose partner held it (a 429) keeps the pace the hold taught it
for a while (``ClaimFilters.paces``, ``rules.targets.learned_pace``): its
kind's claims take this path, and the target is counted and recorded as a
rated one, with its own rate; the kind's other targets are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from django_intents.rules.batches import MAX_LIMIT
from django_intents.rules.limits import Admission, Paces, Rates, Started, heads, rate_for
from django_intents.rules.targets import target_key
from django_intents.store.claims import Claimed, ClaimFilters, Claims, claim_order
from django_intents.store.rows import hydrate, take
from django_intents.store.table import Table

# A scan reads this many more due rows than it may claim, for the intents the
# limits turn away on the way: enough that a claim rarely comes back short.
EXTRA = 4
MAX_EXTRA_ROWS = 1000
# Scans of one claim at most, each without the ordered targets the last found waiting.
ROUNDS = 3

Lock = Callable[[list[str]], contextlib.AbstractContextManager[bool]]
Scan = Callable[[Any, datetime, int, ClaimFilters], list[Any]]


class Ordered(Protocol):
    """What the claim of ordered kinds asks a backend beyond its scan."""

    def ordered_heads(
        self, cursor: Any, pairs: list[tuple[str, str]]
    ) -> dict[tuple[str, str], str]:
        """The id of each (kind, target)'s head, where it has one."""
        ...

    def due_by_id(
        self, cursor: Any, now: datetime, ids: list[str], filters: ClaimFilters
    ) -> list[Any]:
        """The rows of ``ids`` a claim may take now, locked where the database can."""
        ...


def scan_size(limit: int) -> int:
    """How many due rows a limited claim of ``limit`` reads."""
    return min(limit * EXTRA, limit + MAX_EXTRA_ROWS, MAX_LIMIT)


def claim(
    table: Table,
    *,
    lock: Lock,
    scan: Scan,
    ordered: Ordered,
    now: datetime,
    until: datetime,
    limit: int,
    filters: ClaimFilters,
) -> Claims[Claimed]:
    """Claim up to ``limit`` due intents, none of them beyond a limit or out of order.

    ``lock`` is the backend's ``limit_lock``; ``scan(cursor, now, limit,
    filters)`` returns the due rows of its claim statement, locked where the
    database can; ``ordered`` finds the heads of ordered targets.
    """
    counted = sorted({*filters.limits, *filters.ordered})
    paced = {kind for kind, _ in filters.paces}
    with lock(sorted({*counted, *filters.rates, *paced})) as held, table.cursor() as cursor:
        if not held:  # another claim of these kinds kept the lock too long; try next turn
            return Claims(held_back=True)
        admission = Admission(
            filters.limits,
            live_leases(table, cursor, now, counted) if counted else {},
            filters.ordered,
            rates=filters.rates,
            started=recent_starts(table, cursor, now, filters.rates, filters.paces),
            now=now,
            paced=filters.paced,
            paces=filters.paces,
        )
        full_kinds, full_targets = admission.full()
        if filters.kinds is not None and set(filters.kinds) <= set(full_kinds):
            # nothing of these kinds may start: skip the scan
            return Claims(held_back=True, next_start=admission.reopens())
        taken: list[Claimed] = []
        waiting: list[tuple[str, str]] = []  # ordered targets whose head is not due
        held_back = bool(full_kinds or full_targets)
        for _ in range(ROUNDS):
            room = replace(
                filters, full_kinds=tuple(full_kinds), full_targets=(*full_targets, *waiting)
            )
            size = scan_size(limit - len(taken))
            rows = scan(cursor, now, size, room)
            due = hydrate(table, rows)
            pairs = sorted({(i.kind, i.target) for i in due if i.kind in filters.ordered})
            head_of = ordered.ordered_heads(cursor, pairs) if pairs else {}
            found = {i.id for i in due}
            unseen = sorted(id for id in head_of.values() if id not in found)
            if unseen:
                due += hydrate(table, ordered.due_by_id(cursor, now, unseen, room))
            free, behind = heads(due, filters.ordered, head_of)
            free.sort(key=claim_order)
            chosen = admission.admit(free, limit - len(taken))
            taken += take(table, cursor, chosen, now=now, until=until)
            held_back = held_back or bool(behind or admission.refused)
            started = {(i.kind, i.target) for i in free}
            late = sorted(set(pairs) - started - set(waiting))
            if len(taken) >= limit or len(rows) < size or not late:
                break
            waiting += late
            full_kinds, full_targets = admission.full()
        record_starts(
            table, cursor, now, filters.rates, filters.paces, [intent for intent, _ in taken]
        )
        return Claims(taken, held_back=held_back, next_start=admission.reopens())


def live_leases(
    table: Table, cursor: Any, now: datetime, kinds: list[str]
) -> dict[tuple[str, str], int]:
    """How many intents of each limited kind run for each target, leases expired left out."""
    table.execute(cursor, "live_leases", now=table.dt(now), kinds=kinds)
    return {(kind, target): int(count) for kind, target, count in cursor.fetchall()}


def recent_starts(
    table: Table, cursor: Any, now: datetime, rates: Rates, paces: Paces
) -> dict[tuple[str, str], Started]:
    """Per target of each rated kind, and per paced target, the starts inside its
    window at ``now``: one statement per kind and window."""
    windows: dict[tuple[str, timedelta], set[str] | None] = {}
    for kind, rate in rates.items():
        windows[kind, rate.window] = None  # every target of the kind
    for (kind, target), pace in paces.items():
        if kind not in rates:
            targets = windows.setdefault((kind, pace.window), set())
            if targets is not None:
                targets.add(target)
    started = {}
    for (kind, window), targets in sorted(windows.items()):
        table.execute(cursor, "rate_starts", kind=kind, since=table.dt(now - window))
        for target, count, oldest in cursor.fetchall():
            if targets is None or target in targets:
                started[kind, target] = Started(int(count), table.from_db(oldest))
    return started


def record_starts(
    table: Table, cursor: Any, now: datetime, rates: Rates, paces: Paces, taken: list[Any]
) -> None:
    """Write a start at ``now`` for each intent taken of a rated kind or a paced
    target, and prune the starts of those kinds that no claim counts any more:
    older than twice the longest window, so that a claim whose ``now`` was read
    a moment before this one's still finds every start it must count
    (``Rate.room``)."""
    counted = [i for i in taken if rate_for(rates, paces, i.kind, i.target) is not None]
    if not counted:
        return
    at = table.dt(now)
    rows = [(target_key(i.kind, i.target), i.kind, i.target, at) for i in counted]
    table.execute(cursor, "rate_record", rows=rows)
    kinds = sorted({intent.kind for intent in counted})
    windows = [rates[kind].window for kind in kinds if kind in rates]
    windows += [pace.window for (kind, _), pace in paces.items() if kind in kinds]
    table.execute(cursor, "rate_prune", kinds=kinds, before=table.dt(now - 2 * max(windows)))
