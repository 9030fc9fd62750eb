"""How many claims a pool holds at most: running, and queued for a thread.

Short handlers finish faster than the loop can complete and claim, so threads
would wait on its two round trips every turn; holding a second claim per
thread keeps them busy meanwhile (PostgreSQL drain with 4 workers: about 1.6
times the throughput, docs/benchmarks.md). A queued claim's lease is renewed
like a running one, and a stop releases it unstarted. Slow handlers (or none
seen yet) get one claim per thread, so an intent never waits in this process
behind a long handler while another pool is idle.

Async handlers need no claim ahead: the event loop starts each claim the
moment it arrives, so their group's room is ``--concurrency`` less what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .floor import ClaimFloor

CLAIM_AHEAD_BELOW = 0.02  # seconds: handlers quicker than this on average get two claims each


class Demand:
    """The pool's capacity, from a moving average of its handlers' durations."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._handler_time: float | None = None  # seconds

    def learn(self, duration: float) -> None:
        last = self._handler_time
        self._handler_time = duration if last is None else 0.8 * last + 0.2 * duration

    def capacity(self) -> int:
        quick = self._handler_time is not None and self._handler_time < CLAIM_AHEAD_BELOW
        return self._workers * 2 if quick else self._workers


@dataclass
class ClaimGroup:
    """The kinds a pool claims together: those run by threads, or those awaited.

    Each group claims for its own free room, so a thousand free async slots
    never fill the threads' queue, and keeps its own claim floor, since the
    oldest due intent of one group says nothing of the other's.
    """

    kinds: list[str]
    awaited: bool
    floor: ClaimFloor = field(default_factory=ClaimFloor)
