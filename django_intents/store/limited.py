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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from django_intents.rules.batches import MAX_LIMIT
from django_intents.rules.limits import Admission
from django_intents.store.claims import Claimed, ClaimFilters, Claims, claim_order
from django_intents.store.rows import hydrate, take
from django_intents.store.table import Table

# A scan reads this many more due rows than it may claim, for the intents the
# limits turn away on the way: enough that a claim rarely comes back short.
EXTRA = 4
MAX_EXTRA_ROWS = 1000

Lock = Callable[[list[str]], contextlib.AbstractContextManager[bool]]
Scan = Callable[[Any, datetime, int, ClaimFilters], list[Any]]


def scan_size(limit: int) -> int:
    """How many due rows a limited claim of ``limit`` reads."""
    return min(limit * EXTRA, limit + MAX_EXTRA_ROWS, MAX_LIMIT)


def claim(
    table: Table,
    *,
    lock: Lock,
    scan: Scan,
    now: datetime,
    until: datetime,
    limit: int,
    filters: ClaimFilters,
) -> Claims[Claimed]:
    """Claim up to ``limit`` due intents, none of them beyond a limit.

    ``lock`` is the backend's ``limit_lock``; ``scan(cursor, now, limit,
    filters)`` returns the due rows of its claim statement, locked where the
    database can.
    """
    kinds = sorted(filters.limits)
    with lock(kinds) as held, table.cursor() as cursor:
        if not held:  # another claim of these kinds kept the lock too long; try next turn
            return Claims(held_back=True)
        admission = Admission(filters.limits, live_leases(table, cursor, now, kinds))
        full_kinds, full_targets = admission.full()
        if filters.kinds is not None and set(filters.kinds) <= set(full_kinds):
            return Claims(held_back=True)  # nothing of these kinds may start: skip the scan
        room = replace(filters, full_kinds=tuple(full_kinds), full_targets=tuple(full_targets))
        due = sorted(hydrate(table, scan(cursor, now, scan_size(limit), room)), key=claim_order)
        taken = take(table, cursor, admission.admit(due, limit), now=now, until=until)
        held_back = bool(full_kinds or full_targets or admission.refused)
        return Claims(taken, held_back=held_back)


def live_leases(
    table: Table, cursor: Any, now: datetime, kinds: list[str]
) -> dict[tuple[str, str], int]:
    """How many intents of each limited kind run for each target, leases expired left out."""
    table.execute(cursor, "live_leases", now=table.dt(now), kinds=kinds)
    return {(kind, target): int(count) for kind, target, count in cursor.fetchall()}
