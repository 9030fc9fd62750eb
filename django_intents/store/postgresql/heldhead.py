"""Where PostgreSQL's exact limited claim starts its walk: past the held-back head.

A partner that is down keeps its ``per_target`` places taken, and its due
intents stay pending at the head of the queue, in order. The claim walks the
claim index in order and must read each row to learn its target, so every
claim of the pool stepped over the whole backlog of a dead partner again: 900
rows and 1.7 ms of a 4 ms claim in the relay benchmark, and a cost that grew
with the backlog (``bench/held_backlog.py``) while the healthy partners
waited behind it.

A pool's claim memory (``store/memory.py``) therefore remembers the head it
stepped over, as a short stack of ``Level``s: each names a target and a
position in claim order, and every due intent of priority 0 before a
level's position belongs to the targets of that level or the ones below it.
The full claim, once a second (``floor.py``), looks for the head: the first
due intent, and, while the intents found there have no room, the first after
them of another target.
The claims above the floor in between start at the last level whose targets,
and all below it, are still full. The test of "still full" is in the
statement, against the live leases it counts, so a target that frees a
place is walked again from the floor in the same claim, oldest first. Each
such claim moves the top level's position to the first due intent outside
the stack's targets (one index probe from the position, which in steady
state reads a row or two), and pushes that intent's target when it has no
room either. Levels whose target has room are dropped with those above
them; once none is left, the claims walk from the floor again with the
plain statement until the next full claim. The probe costs about 3 ms of
parsing and planning (the statement is planned on every claim), more than
a backlog of a thousand intents costs to walk: so only the full claim
looks for a head, and the others use one only while it holds.

What the stack cannot know is an intent that lands before a position
afterwards: one written with a ``next_at`` in the past, an expired lease on
an intent that became due long ago. The claim floor has the same blind spot
and the same remedy: the pool's full claim walks from the start and makes
the stack anew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_intents.store.claims import ClaimFilters

MAX_LEVELS = 8  # targets a stack names at most: each costs a test per probed row
# The claim's columns after its rows (``head_info`` in sql/postgresql.sql): the
# stack levels still valid, the probed head's key and target, whether that
# target is full, and the oldest ``next_at`` among the live leases.
INFO_COLUMNS = 8


@dataclass(frozen=True)
class Level:
    """Every due intent of priority 0 before ``key`` is of this level's target or
    of a level below it (when the level was made)."""

    key: tuple[datetime, datetime, str]  # next_at, created_at, id: claim order
    kind: str
    target: str


def key_of(filters: ClaimFilters) -> tuple[Any, ...]:
    """The claims a remembered head serves: those that walk the same rows.

    A head found by a claim of some kinds says nothing of the intents of
    other kinds before it, nor of expired leases that an attempt cap left
    out."""
    kinds = None if filters.kinds is None else tuple(sorted(filters.kinds))
    return (tuple(sorted(filters.limits)), kinds, filters.max_attempts)


def parameters(levels: list[Level], floor: datetime | None, dt: Any) -> dict[str, Any]:
    """The parameters of ``held_head`` (sql/postgresql.sql): the stack, and the floor."""
    return {
        "l_at": [dt(level.key[0]) for level in levels],
        "l_created": [dt(level.key[1]) for level in levels],
        "l_id": [level.key[2] for level in levels],
        "l_kind": [level.kind for level in levels],
        "l_target": [level.target for level in levels],
        "head_floor": None if floor is None else dt(floor),
    }


def advanced(levels: list[Level], info: tuple[Any, ...]) -> list[Level]:
    """The stack after a claim that answered ``info`` (``INFO``)."""
    valid, at, created, id, kind, target, full, _ = info  # noqa: A001 - the column's name
    kept = levels[:valid]
    if at is None:  # nothing due outside the stack's targets: its positions still hold
        return kept
    key = (at, created, id)
    if kept:
        kept[-1] = Level(key, kept[-1].kind, kept[-1].target)
    if full and len(kept) < MAX_LEVELS:
        kept.append(Level(key, kind, target))
    return kept
