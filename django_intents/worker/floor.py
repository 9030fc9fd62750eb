"""Where a pool's claims start walking the claim index.

On PostgreSQL an intent that finishes leaves its old row versions behind, and
their entries stay in the claim index until VACUUM removes them. They sort by
``next_at`` like the live ones, and they are older, so a claim that walks the
index from its start steps over every one of them before it reaches the first
live intent: the more finished intents wait for VACUUM, the more index pages
every claim reads, where a vacuumed table needs a handful.

A pool therefore remembers a floor: an instant before which no due intent of
its kinds was seen, and claims with ``since=floor``, which starts the walk
there. The floor is of priority 0 only; intents of other priorities have an
index of their own, usually small, which every claim walks from its start. A
claim or probe that finds intents raises the floor to the oldest it found;
one that finds none raises it to ``now - SLACK``. Once every
``FULL_SCAN_EVERY`` seconds the pool claims without a floor, which finds what
the floor can miss: an expired lease on an intent that became due long ago, an
intent written with a ``next_at`` in the past, or one whose transaction
committed more than ``SLACK`` after its ``next_at``. Such an intent waits at
most that much longer; nothing is ever skipped for good.

A full claim costs what the dead entries before the first live intent cost to
walk, and while a transaction elsewhere holds back vacuum they only pile up:
half a second a claim with a million of them, which at one a second is half
the pool's time. So the next full claim comes after ``FULL_SCAN_EVERY`` or
after the last one's duration divided by ``FULL_SCAN_SHARE``, whichever is
later, but never more than ``FULL_SCAN_MAX`` later: full claims take at most
that share of a pool's time, and what only they find waits at most that long.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_intents.store.claims import Claims

FULL_SCAN_EVERY = 1.0  # seconds between claims that walk the whole claim index
FULL_SCAN_SHARE = 0.05  # of a pool's time, at most, spent in those claims
FULL_SCAN_MAX = 30.0  # seconds between them, however long they take
SLACK = timedelta(seconds=2)  # how late a new intent may commit and still be claimed in order


class ClaimFloor:
    """The ``since`` a pool claims with; ``None`` when it is time for a full scan."""

    def __init__(
        self,
        *,
        every: float = FULL_SCAN_EVERY,
        share: float = FULL_SCAN_SHARE,
        longest: float = FULL_SCAN_MAX,
        slack: timedelta = SLACK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every = every
        self._share = share
        self._longest = longest
        self._slack = slack
        self._clock = clock
        self._floor: datetime | None = None
        self._full_scan_at = 0.0

    def since(self) -> datetime | None:
        if self._floor is None or self._clock() >= self._full_scan_at:
            return None
        return self._floor

    def rescan(self) -> None:
        """Make the next claim a full scan."""
        self._full_scan_at = 0.0

    def claimed(
        self,
        since: datetime | None,
        now: datetime,
        intents: Claims[Any],
        limit: int,
        *,
        took: float = 0.0,
    ) -> None:
        """Record a claim of up to ``limit`` made at ``now`` with ``since``, which took
        ``took`` seconds.

        The floor is of priority 0 (the claim's branches, ``store/sql/common.sql``): the
        claim's first intent may be of another priority and due later than
        intents of priority 0 it never reached, when it filled up before it
        walked them. Then it says nothing about the floor.

        A claim that ``LIMITS`` may have held back from an intent it walked
        (``intents.held_back``) leaves the floor where it is: that intent
        must stay above the floor to run as soon as its slot frees. A floored
        claim walked nothing below the floor, so the floor still holds. A
        full one may have been held back from an intent below it: it sets the
        floor to the first due intent it saw, held back or not, when it knows
        it (``Claims.oldest_due``: PostgreSQL's exact claim), and otherwise
        the pool scans fully until a claim holds nothing back.
        """
        if intents.held_back:
            if since is None:
                if intents.oldest_due is None:
                    self._floor = None
                else:
                    self.seen(None, now, intents.oldest_due, took=took)
            return
        zero = [intent.next_at for intent in intents if intent.priority == 0]
        if zero:
            self.seen(since, now, min(zero), took=took)
        elif len(intents) < limit:
            self.seen(since, now, None, took=took)

    def seen(
        self, since: datetime | None, now: datetime, oldest: datetime | None, *, took: float = 0.0
    ) -> None:
        """Record what a claim or probe made at ``now`` with ``since`` found, in ``took`` seconds.

        ``oldest`` is the ``next_at`` of the first intent it found, ``None``
        when it found none. A full scan sets the floor, and when the next one
        comes by its cost; a floored one can only raise it, since what lies
        below was not looked at.
        """
        bound = now - self._slack if oldest is None else min(oldest, now - self._slack)
        if since is None:
            self._floor = bound
            period = min(max(self._every, took / self._share), self._longest)
            self._full_scan_at = self._clock() + period
        elif self._floor is not None:
            self._floor = max(self._floor, bound)
