"""What a claim is asked with and what it answers: shared by every backend and the manager."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django_intents.rules.limits import Limit

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow


# The largest LIMIT that SQLite, PostgreSQL and MariaDB all accept.
MAX_LIMIT = 2**63 - 1


@dataclass(frozen=True)
class ClaimFilters:
    """The optional conditions of a claim or a due probe, as the manager checked them."""

    kinds: list[str] | None = None  # None: every kind
    since: datetime | None = None  # leave out intents due before this (the claim floor)
    max_attempts: int | None = None  # leave out expired leases that used the last attempt
    # The limits of the kinds claimed (``limits.py``); empty: the claim is unlimited.
    limits: Mapping[str, Limit] = field(default_factory=dict)
    # Set by a limited claim for its scan: kinds and (kind, target) pairs with no room left.
    full_kinds: tuple[str, ...] = ()
    full_targets: tuple[tuple[str, str], ...] = ()


def exclusions(filters: ClaimFilters) -> tuple[str, list[Any]]:
    """The SQL that leaves out what a limit has no room for: portable, no row values."""
    where, params = "", []
    if filters.full_kinds:
        where = f" AND kind NOT IN ({', '.join(['%s'] * len(filters.full_kinds))})"
        params += filters.full_kinds
    if filters.full_targets:
        pairs = " OR ".join(["(kind = %s AND target = %s)"] * len(filters.full_targets))
        where += f" AND NOT ({pairs})"
        params += [value for pair in filters.full_targets for value in pair]
    return where, params


Claimed = tuple["IntentRow", datetime | None]  # the intent, and the lease it took over, if any

T = TypeVar("T")


class Claims(list[T]):
    """What a claim took, whether a due intent the claim passed stays behind, and
    whether a limit was near enough to bind it.

    A pool raises its claim floor (``floor.py``) past the intents a claim
    walked only when none was held back: one that was must stay above the
    floor, so that it runs as soon as its slot frees. A claim that cannot
    tell says ``held_back``. ``bound`` (by default ``held_back``) tells the
    pool's event loop whether a claim queued ahead could take a place an
    intent waits for (``Demand.claimed``): not when a claim took fewer than
    it asked only because it asked for more than a far cap left.
    ``completed`` lists the claims given to complete first (``Riders``)
    that were still held and are now completed. ``oldest_due``, when a
    claim without a floor knows it, is the ``next_at`` of the first due
    intent of priority 0, held back or not (the claim's ``now`` when none
    was due): no held-back intent lies below it, so the pool's floor may
    rise to it (``ClaimFloor.claimed``).
    """

    def __init__(
        self,
        items: Sequence[T] = (),
        *,
        held_back: bool = False,
        bound: bool | None = None,
        completed: Sequence[Any] = (),
        oldest_due: datetime | None = None,
    ) -> None:
        super().__init__(items)
        self.held_back = held_back
        self.bound = held_back if bound is None else bound
        self.completed = list(completed)
        self.oldest_due = oldest_due

    def carrying(self, items: Sequence[Any], *, completed: Sequence[Any]) -> Claims[Any]:
        """``items`` (this claim's, as another type) with what this claim says of itself."""
        held_back, bound, oldest_due = self.held_back, self.bound, self.oldest_due
        return Claims(
            items, held_back=held_back, bound=bound, completed=completed, oldest_due=oldest_due
        )


@dataclass
class Riders:
    """Claims to complete in the transaction of a claim, before it takes anything.

    A pool's finished claims hold their target's place under ``LIMITS``
    until their result is written. Written by the recorder's thread, that
    was some 8 ms after the handler returned, and the next claim could not
    use the place before its own round trip after that; completed by the
    claim itself (PostgreSQL: one more statement in the claim's one round
    trip), the place is free for the claim that follows the return.
    ``done`` holds ``(id, kind)`` of each completed, once ``sent``.
    """

    pairs: list[tuple[str, str]]
    at: Any = None  # the completion time, as the backend's driver takes it
    done: list[tuple[str, str]] = field(default_factory=list)
    sent: bool = False


def claim_order(intent: IntentRow) -> tuple[int, datetime, datetime, str]:
    """The order claims take intents in (``Intent.Meta.ordering``), for sorting in Python."""
    return (-intent.priority, intent.next_at, intent.created_at, intent.id)


@dataclass(frozen=True)
class Branch:
    """One range of the claim index a claim walks: its priorities, their order, their index.

    A claim walks ``BRANCHES`` in turn, each up to what the claim still needs,
    so that intents of the default priority 0, nearly always all of them, are
    found exactly as before priorities existed: on the claim index, from the
    pool's floor (``floor.py``). The other priorities sit in a small index of
    their own (``intents_high_priority_idx``, ``intents_low_priority_idx``),
    which each claim probes in microseconds when it is empty. One index led
    by priority would serve every row, but a floor on ``next_at`` could no
    longer start its walk: every claim would step over all the finished
    rows' entries that VACUUM has not yet removed.
    """

    name: str
    where: str  # the partial index's own condition, so that the planner may use it
    order: str
    index: str  # the index that serves it (SQLite's INDEXED BY)
    floored: bool  # whether the pool's claim floor applies


PRIORITIZED_ORDER = "ORDER BY priority DESC, next_at, created_at, id"
BRANCHES = (
    Branch("high", "priority > 0", PRIORITIZED_ORDER, "intents_high_priority_idx", False),
    Branch(
        "zero", "priority = 0", "ORDER BY next_at, created_at, id", "intents_claimable_idx", True
    ),
    Branch("low", "priority < 0", PRIORITIZED_ORDER, "intents_low_priority_idx", False),
)


# Where the claim floor (``since``) goes in the branch of priority 0.
FLOOR = "{floor}"


def branch_union(branches: Sequence[Branch]) -> str:
    """The rows of the CTEs ``branch_<name>`` of ``branches``, one after the other."""
    return " UNION ALL ".join(f"SELECT * FROM branch_{b.name}" for b in branches)


def branches(part: str) -> str:
    """``part`` for each branch, joined by ``UNION ALL`` (see ``branch_parts``)."""
    return " UNION ALL ".join(branch_parts(part))


def branch_parts(part: str) -> list[str]:
    """``part`` for each of ``BRANCHES``: ``{branch}``, ``{order}``, ``{index}`` and
    ``{name}`` take the branch's condition, order, index and an alias; the branch
    of priority 0 gets the floor after ``{filters}``. ``{room}`` is a limit less
    what the branches before this one took (``branch_<name>`` of each, where the
    statement names them so)."""
    return [
        part.replace("{branch}", b.where)
        .replace("{filters}", "{filters}" + (FLOOR if b.floored else ""))
        .replace("{order}", b.order)
        .replace("{index}", b.index)
        .replace("{name}", f"branch_{b.name}")
        .replace(
            "{room}",
            " - ".join(["%s", *(f"(SELECT count(*) FROM branch_{a.name})" for a in BRANCHES[:i])]),
        )
        for i, b in enumerate(BRANCHES)
    ]
