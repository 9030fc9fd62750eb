"""What a claim is asked with and what it answers: shared by every backend and the manager."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django_intents.rules.limits import Limit
from django_intents.rules.targets import Rate
from django_intents.store.memory import ClaimMemory

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow


@dataclass(frozen=True)
class ClaimFilters:
    """The optional conditions of a claim or a due probe, as the manager checked them."""

    kinds: list[str] | None = None  # None: every kind
    since: datetime | None = None  # leave out intents due before this (the claim floor)
    max_attempts: int | None = None  # leave out expired leases that used the last attempt
    # The limits of the kinds claimed (``limits.py``); empty: the claim is unlimited.
    limits: Mapping[str, Limit] = field(default_factory=dict)
    # The rates of the kinds claimed (SPEC §14): such a claim takes ``limited.py``'s path.
    rates: Mapping[str, Rate] = field(default_factory=dict)
    # The paces a handler's hold taught targets of kinds without a rate (SPEC §14,
    # ``rules.targets.learned_pace``), per (kind, target): such a claim takes
    # ``limited.py``'s path while one lasts.
    paces: Mapping[tuple[str, str], Rate] = field(default_factory=dict)
    # The kinds claimed with "ordered": True (SPEC §14): each target's intents
    # start one at a time, oldest first. They take the limited claim too.
    ordered: tuple[str, ...] = ()
    # At most this many intents of the rated and ordered kinds in this claim (``Admission``).
    paced: int | None = None
    # Set by a limited claim for its scan: kinds and (kind, target) pairs with no room left.
    full_kinds: tuple[str, ...] = ()
    full_targets: tuple[tuple[str, str], ...] = ()
    # The keys of the half-open targets (``TargetState``) this claimer read, of
    # which it may take one intent each as the probe (``store/targets.py``).
    exempt: tuple[str, ...] = ()

    @property
    def limited(self) -> bool:
        """Whether the claim takes the limited path: ``LIMITS`` caps, rates, paces or
        ordered kinds."""
        return bool(self.limits or self.rates or self.paces or self.ordered)


@dataclass(frozen=True)
class Ask:
    """One claim as the manager asked it: up to ``limit`` due intents at ``now``,
    leased until ``until``, after completing ``complete`` (``Riders``), with
    what the pool's claims remember (``memory``; ``None``: nothing learned)."""

    now: datetime
    until: datetime
    limit: int
    filters: ClaimFilters
    complete: list[tuple[str, str]] = field(default_factory=list)
    memory: ClaimMemory | None = None


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
    rise to it (``ClaimFloor.claimed``). ``next_start``, from a claim of kinds
    with a ``rate``, is when the first of their targets whose window is full
    may start again: a pool wakes then, not at its next poll.
    """

    def __init__(
        self,
        items: Sequence[T] = (),
        *,
        held_back: bool = False,
        bound: bool | None = None,
        completed: Sequence[Any] = (),
        oldest_due: datetime | None = None,
        next_start: datetime | None = None,
    ) -> None:
        super().__init__(items)
        self.held_back = held_back
        self.bound = held_back if bound is None else bound
        self.completed = list(completed)
        self.oldest_due = oldest_due
        self.next_start = next_start

    def carrying(self, items: Sequence[Any], *, completed: Sequence[Any]) -> Claims[Any]:
        """``items`` (this claim's, as another type) with what this claim says of itself."""
        held_back, bound, oldest_due = self.held_back, self.bound, self.oldest_due
        return Claims(
            items,
            held_back=held_back,
            bound=bound,
            completed=completed,
            oldest_due=oldest_due,
            next_start=self.next_start,
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
    # PostgreSQL: the day partition the completed move into (postgresql/days.Days.into).
    into: dict[str, Any] = field(default_factory=dict)
    done: list[tuple[str, str]] = field(default_factory=list)
    sent: bool = False


def claim_order(intent: IntentRow) -> tuple[int, datetime, datetime, str]:
    """The order claims take intents in (``Intent.Meta.ordering``), for sorting in Python."""
    return (-intent.priority, intent.next_at, intent.created_at, intent.id)
