"""Where PostgreSQL's exact limited claim starts its walk: past the held-back head.

A partner that is down keeps its ``per_target`` places taken, and its due
intents stay pending at the head of the queue, in order. The claim walks the
claim index in order and must read each row to learn its target, so every
claim of the pool stepped over the whole backlog of a dead partner again: 900
rows and 1.7 ms of a 4 ms claim in the relay benchmark, and a cost that grew
with the backlog (``bench/held_backlog.py``) while the healthy partners
waited behind it.

A pool's backend therefore remembers the head it stepped over, as a short
stack of ``Level``s: each names a target and a position in claim order, and
every due intent of priority 0 before a level's position belongs to the
targets of that level or the ones below it. The full claim, once a second
(``floor.py``), looks for the head: the first due intent, and, while the
intents found there have no room, the first after them of another target.
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
# The claim's columns after its rows: the stack levels still valid, the
# probed head's key and target, whether that target is full, and the
# oldest ``next_at`` among the live leases (``live.since``).
INFO_COLUMNS = 8

# After the claim's ``full_targets`` and ``full_kinds``; ``{due}`` is the due
# test of priority 0 with the claim's filters. ``lv``: the levels, each valid
# while it and every level below name full targets; ``kp``: the valid ones;
# ``st``: where the walk may start, the last valid level or the floor;
# ``hd``: the head, the first due intent from there that no valid level names.
# The walk of priority 0 starts at the head. (Short names: the statement must
# stay under psycopg's 4,096 bytes, see ``LimitedClaims.build_limited``.)
CTES = (
    "lv AS MATERIALIZED (SELECT l.*, bool_and(l.shut) OVER (ORDER BY l.n) AS valid FROM "
    "(SELECT l.*, ((l.kind, l.target) IN (SELECT kind, target FROM full_targets) "
    "OR l.kind IN (SELECT kind FROM full_kinds)) AS shut FROM unnest(%s::timestamptz[], "
    "%s::timestamptz[], %s::text[], %s::text[], %s::text[]) WITH ORDINALITY "
    "AS l(at, created, id, kind, target, n)) AS l), "
    "kp AS MATERIALIZED (SELECT * FROM lv WHERE valid), "
    "st AS MATERIALIZED (SELECT * FROM (SELECT at, created, id FROM kp UNION ALL "
    "SELECT COALESCE(%s::timestamptz, '-infinity'), '-infinity', '') AS s "
    "ORDER BY at DESC, created DESC, id DESC LIMIT 1), "
    "hd AS MATERIALIZED (SELECT t.next_at, t.created_at, t.id, t.kind, t.target "
    "FROM {table} AS t WHERE {due} AND (t.next_at, t.created_at, t.id) >= ((SELECT at FROM "
    "st), (SELECT created FROM st), (SELECT id FROM st)) AND (t.kind, t.target) "
    "NOT IN (SELECT kind, target FROM kp) ORDER BY next_at, created_at, id LIMIT 1), "
)
# The walk of priority 0, where the floor went.
FROM_HEAD = (
    " AND (t.next_at, t.created_at, t.id) >= ((SELECT next_at FROM hd), "
    "(SELECT created_at FROM hd), (SELECT id FROM hd))"
)
# The columns of INFO_COLUMNS, from a one-row join that has them even when
# the claim took nothing.
INFO = (
    "(SELECT count(*) FROM kp), hd.next_at, hd.created_at, hd.id, hd.kind, "
    "hd.target, (hd.kind, hd.target) IN (SELECT kind, target FROM full_targets) "
    "OR hd.kind IN (SELECT kind FROM full_kinds), (SELECT min(since) FROM live)"
)
INFO_FROM = "(SELECT 1) AS one LEFT JOIN hd ON true"


def told(statement: str) -> str:
    """A claim ending in its ``UPDATE``, made to answer ``INFO`` after its rows."""
    ctes, claim_update = statement.rsplit(" UPDATE ", 1)
    return (
        f"{ctes}, claimed AS (UPDATE {claim_update}) SELECT claimed.*, {INFO} "
        f"FROM {INFO_FROM} LEFT JOIN claimed ON true"
    )


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


def parameters(levels: list[Level], floor: datetime | None, dt: Any) -> list[Any]:
    """The parameters of ``CTES`` before the head's due test."""
    return [
        [dt(level.key[0]) for level in levels],
        [dt(level.key[1]) for level in levels],
        [level.key[2] for level in levels],
        [level.kind for level in levels],
        [level.target for level in levels],
        None if floor is None else dt(floor),
    ]


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
