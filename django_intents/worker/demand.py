"""How many claims a pool holds at most: running, and queued for a thread.

Short handlers finish faster than the loop can complete and claim, so threads
would wait on its round trips every turn. The pool therefore keeps a local
queue for quick handlers: it claims ahead what its threads finish in
``QUEUE_FOR`` seconds at the rate they have been finishing, up to
``QUEUE_MAX``, in one statement. A no-op drain then claims hundreds of
intents per round trip instead of two per thread (docs/benchmarks.md, "The
local queue"). A queued claim's lease is renewed like a running one, and a
stop releases it unstarted.

The queue must not keep intents waiting in this process behind handlers that
suddenly take long while another pool is idle. So it is sized from the rate
at which threads have *finished* (a thread stuck in a handler finishes
nothing), never holds more than ``lease / 10`` seconds of that rate, and once
no handler has returned for ``STALL_AFTER`` seconds, the pool gives back all
but one queued claim per thread (``give_back_stalled``) and claims as a pool
of slow handlers does until they return again. Slow handlers (or none seen
yet) get one claim per thread, and a second only for what they free within a
turn.

Async handlers get a queue too, whatever their duration: the event loop
starts a queued claim the moment an awaited handler returns, so a slot does
not idle through the loop's record and claim round trips (docs/benchmarks.md,
"The event loop's queue"). A queued claim waits
for a free slot, not behind one handler, so its wait is the queue over the
rate at which slots free, whatever a handler takes: the event loop holds up
to ``--concurrency`` more claims than it runs, as many as its handlers
finish in ``QUEUE_FOR`` seconds, and gives them all back when none returns
for ``STALL_AFTER`` seconds. For kinds with ``LIMITS``, only what frees during
a turn (``claim_groups``), unless their last claim found room for all it
asked (``Demand.claimed``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from django_intents.handlers import Handler
from django_intents.worker.execution import is_async
from django_intents.worker.floor import ClaimFloor
from django_intents.worker.leases import LeaseTable
from django_intents.worker.queues import Queued
from django_intents.worker.shutdown import Shutdown

CLAIM_AHEAD_BELOW = 0.02  # seconds: handlers quicker than this on average get a local queue
QUEUE_FOR = 0.1  # seconds of the threads' finishing rate that the local queue holds
QUEUE_MAX = 1000  # claims queued beyond one per thread, at most
RATE_OVER = 0.25  # seconds over which the finishing rate is averaged
STALL_AFTER = 0.25  # seconds without a returned handler after which the queue is given back


class Demand:
    """The pool's capacity, from moving averages of its handlers' durations, its turns'
    durations and the rate at which its threads finish."""

    def __init__(
        self,
        workers: int,
        *,
        lease: float = 30.0,
        awaited: bool = False,
        ahead: bool = True,
        rated: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = workers  # threads, or the event loop's slots (``awaited``)
        self._awaited = awaited
        self._rated = rated  # its kinds are all rated or ordered: claim only what starts now
        self._ahead = ahead  # a full window ahead for the event loop (no LIMITS on its kinds)
        self._roomy = False  # the group's last claim vouched that no limit held an intent back
        # Queued claims a stall leaves: one per thread; the event loop's slots
        # take theirs at once, so what waits there is all ahead.
        self._keep = 0 if awaited else workers
        self._window = min(QUEUE_FOR, lease / 10)
        self._clock = clock
        self._handler_time: float | None = None  # seconds
        self._turn_time = 0.0  # seconds from the start of a busy turn to the end of its claim
        self._rate = 0.0  # handlers returned per second, averaged over turns
        self._returns = 0  # since the last turn
        self._mark = clock()  # the end of the last turn
        self._last_return = -math.inf
        self._small_at = (
            -math.inf
        )  # the last turn that found no more than a claim per thread queued

    @property
    def slots(self) -> int:
        """The threads, or the event loop's slots."""
        return self._workers

    def paced(self, busy: int, waiting: int) -> int:
        """How many intents of its rated and ordered kinds a claim of a mixed group may take.

        A rated kind's claim is the start its rate counts, so what it takes
        must start at once, not wait behind the queue and start bunched with
        the next window's; an ordered head waiting holds its whole target. So:
        the slots free now, or one when none is (it goes to
        the front of the queue, ``queues.rank``, and starts as the next slot
        frees), less those of its claims still waiting for a slot.
        """
        return max(max(self._workers - busy, 1) - waiting, 0)

    def learn(self, duration: float) -> None:
        last = self._handler_time
        self._handler_time = duration if last is None else 0.8 * last + 0.2 * duration
        self._returns += 1
        self._last_return = self._clock()

    def turned(self, duration: float) -> None:
        self._turn_time = 0.8 * self._turn_time + 0.2 * duration
        # The rate is averaged over time, not turns: a pool turns whenever a
        # thread finishes, and a per-turn average of one-return turns swings
        # the capacity, and with it the moments the pool claims.
        now = self._clock()
        elapsed = now - self._mark
        if elapsed > 0:
            weight = 1.0 - math.exp(-elapsed / RATE_OVER)
            self._rate += weight * (self._returns / elapsed - self._rate)
        self._returns, self._mark = 0, now

    def claimed(self, bound: bool) -> None:
        """Note whether a limit may have bound the last claim (``Claims.bound``).

        While the claims of kinds with ``LIMITS`` find room for all they ask,
        as under a ``per_target`` far above a partner's share, a claim queued
        ahead takes no place an intent would wait for, so the event loop
        queues a full window, as for kinds without limits: with a turn's
        worth only, its slots would idle through each claim for a limit that
        holds nothing back (docs/benchmarks.md).
        """
        self._roomy = not bound

    def wake_at(self, queued: int) -> float:
        """When the queue must be given back if no handler returns (``give_back_stalled``)."""
        if queued <= self._keep:
            return math.inf
        return max(self._last_return, self._small_at) + STALL_AFTER

    def stalled(self) -> bool:
        """No handler has returned for ``STALL_AFTER`` seconds.

        It holds until one returns: after a give-back the pool claims as a
        pool of slow handlers, so it does not claim again what it gave back.
        """
        return self._clock() - self._last_return >= STALL_AFTER

    def capacity(self) -> int:
        """The threads, and the claims they are expected to finish before the next claim.

        A thread that finishes waits for the loop's next claim; with many
        threads that is most of a turn, every time. Quick handlers get the
        local queue (at least one claim ahead per thread); others queue what
        their threads free within a turn, never more than a thread each.
        A group of rated or ordered kinds alone claims only for its idle threads
        or slots: a claim is the start the rate counts, or a head that holds its
        target, so what it takes must start now, not wait in a queue and start
        later, bunched with the next window's (such kinds beside others: ``paced``).
        """
        if self._rated:
            return self._workers
        handler = self._handler_time
        if handler is None:
            return self._workers
        if self._awaited:
            if self.stalled():
                return self._workers
            # Kinds with LIMITS: only what frees while a claim is on its way (``claim_groups``).
            window = self._window if self._ahead or self._roomy else self._turn_time
            return self._workers + min(int(self._rate * window), self._workers)
        if handler < CLAIM_AHEAD_BELOW:
            if self.stalled():
                return self._workers * 2
            ahead = min(int(self._rate * self._window), QUEUE_MAX)
            return self._workers + max(ahead, self._workers)
        return self._workers + min(int(self._workers * self._turn_time / handler), self._workers)

    def give_back_stalled(self, jobs: Queued, leases: LeaseTable, shutdown: Shutdown) -> None:
        """Release the local queue beyond one claim per thread (for the event loop:
        all of it) once the handlers stall.

        Called every turn. The queue stalled if no handler returned for
        ``STALL_AFTER`` seconds while it held more than that: a pool that was
        idle, not stalled, does not give back what it claims next.
        """
        now = self._clock()
        if jobs.qsize() <= self._keep:
            self._small_at = now
        elif now >= max(self._last_return, self._small_at) + STALL_AFTER:
            claims = jobs.take(jobs.qsize() - self._keep)
            for claim in claims:
                leases.drop(claim)
            shutdown.release(claims, started=False)


@dataclass
class ClaimGroup:
    """The kinds a pool claims together: those run by threads, or those awaited.

    Each group claims for its own free room, so a thousand free async slots
    never fill the threads' queue, and keeps its own claim floor, since the
    oldest due intent of one group says nothing of the other's.
    """

    kinds: list[str]
    awaited: bool
    demand: Demand
    floor: ClaimFloor = field(default_factory=ClaimFloor)
    limited: bool = False  # one of its kinds has LIMITS: its claims complete results first
    # Its rated and ordered kinds, when it has others too: the claims queue
    # those ahead and take these only for what starts at once (``Demand``).
    paced: frozenset[str] = frozenset()
    # When a target of its rated kinds may start again (``Claims.next_start``),
    # on the monotonic clock: the pool wakes then to claim it.
    reopens: float = math.inf


def claim_groups(
    handlers: Mapping[str, Handler],
    workers: int,
    concurrency: int,
    lease: float,
    limited: Collection[str],
    paced: Collection[str] = (),
) -> list[ClaimGroup]:
    """The threads' group and the event loop's, in that order: indexed by ``Claim.awaited``.

    While one of its kinds has ``LIMITS``, the event loop claims ahead only
    what its slots free during one of the pool's turns, not in ``QUEUE_FOR``:
    a claim waiting for a slot holds one of its target's ``per_target``
    places without running, so a window ahead sends a rate-limited partner
    its deliveries in bursts, over its limit; a turn's worth only fills the
    slots that would idle through the claim's round trip (docs/benchmarks.md,
    "The event loop's queue"). Its kinds that must start at once (``paced``:
    rated and ordered ones, ``rules.limits.paced_kinds``) leave the others
    their queue: a claim takes of theirs only what starts now.
    """
    awaited = {kind for kind, handler in handlers.items() if is_async(handler)}
    groups = []
    for a in (False, True):
        group = [kind for kind in sorted(handlers) if (kind in awaited) is a]
        bound = any(kind in limited for kind in group)
        size = concurrency if a else workers
        starting = frozenset(kind for kind in group if kind in paced)
        # Only such kinds: every claim is what starts now. Among others: the
        # others keep their queue, and these are capped per claim.
        alone = bool(starting) and len(starting) == len(group)
        capped = any(kind in limited and kind not in starting for kind in group)
        demand = Demand(size, lease=lease, awaited=a, ahead=not a or not capped, rated=alone)
        groups.append(
            ClaimGroup(group, a, demand, limited=bound, paced=frozenset() if alone else starting)
        )
    return groups
