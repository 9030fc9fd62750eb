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
    """The pool's capacity, from moving averages of its handlers' and its turns' durations."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._handler_time: float | None = None  # seconds
        self._turn_time = 0.0  # seconds from the start of a busy turn to the end of its claim

    def learn(self, duration: float) -> None:
        last = self._handler_time
        self._handler_time = duration if last is None else 0.8 * last + 0.2 * duration

    def turned(self, duration: float) -> None:
        self._turn_time = 0.8 * self._turn_time + 0.2 * duration

    def capacity(self) -> int:
        """The threads, and the claims they are expected to finish during one turn.

        A thread that finishes waits for the loop's next claim; with many
        threads that is most of a turn, every time. Queuing the claims that
        threads free within a turn keeps them busy; a queued claim then waits
        about a turn, never behind a long handler, since long handlers free
        almost none per turn.
        """
        handler = self._handler_time
        if handler is None:
            return self._workers
        if handler < CLAIM_AHEAD_BELOW:
            return self._workers * 2
        return self._workers + min(int(self._workers * self._turn_time / handler), self._workers)


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
