"""The claims a pool holds that no handler has started yet, in claim order.

A claim's intents come in claim order, so a queue stays in that order while
each claim's intents rank no higher than those already queued; an intent of
a higher priority (an urgent one enqueued while the queue is full of a
backlog) is put ahead of them, so it waits for no more than the claim that
brought it. The threads' ``LocalQueue`` and the event loop's waiting claims
both keep that order; ``Queued`` is what a stop or a stall takes back from
either.
"""

from __future__ import annotations

import queue
from typing import Protocol

from django_intents.worker.execution import Claim


class Queued(Protocol):
    """Claims waiting to start: the threads' ``LocalQueue``, or the event loop's."""

    def qsize(self) -> int: ...

    def take(self, count: int) -> list[Claim]: ...


Rank = tuple[bool, int]


def rank(claim: Claim) -> Rank:
    """Where a claim waits: a paced one (a rated or ordered kind's, ``Demand.paced``)
    first, since its claim is the start its rate counted or its target's turn;
    then by priority, the first key of ``states.CLAIM_ORDER``."""
    return (claim.paced, claim.intent.priority)


LOWEST: Rank = (False, 0)


def outranks(claims: list[Claim], last: Rank) -> bool:
    """Whether one of ``claims`` ranks above ``last``, the rank of the lowest queued.

    A claim's intents come in priority order, so the queue stays in order
    while a claim outranks nothing queued, and its intents go at its end.
    """
    return max(rank(c) for c in claims) > last


def by_priority(claims: list[Claim]) -> list[Claim]:
    """``claims`` highest rank first; stable, so each rank keeps the claim order its
    claims brought."""
    return sorted(claims, key=rank, reverse=True)


def in_rank(claims: list[Claim]) -> list[Claim]:
    """One claim's intents as they are to wait: already in claim order, unless some
    are paced, which go first."""
    return by_priority(claims) if any(c.paced for c in claims) else claims


class LocalQueue(queue.SimpleQueue[Claim | None]):
    """The claims waiting for a worker thread, highest priority first; ``None`` ends a thread."""

    def __init__(self) -> None:
        super().__init__()
        self._last = LOWEST  # the rank of the claim put last, the lowest queued

    def put_claims(self, claims: list[Claim]) -> None:
        if not claims:
            return
        claims = in_rank(claims)
        if self.qsize() and outranks(claims, self._last):
            claims = by_priority(self.take(self.qsize()) + claims)
        for claim in claims:
            self.put(claim)
        self._last = rank(claims[-1])

    def take(self, count: int) -> list[Claim]:
        """Up to ``count`` queued claims, first first; a worker may take some meanwhile."""
        claims: list[Claim] = []
        while len(claims) < count:
            try:
                claim = self.get_nowait()
            except queue.Empty:
                break
            if claim is None:  # stop sentinels are only queued once the loop has ended
                break
            claims.append(claim)
        return claims
