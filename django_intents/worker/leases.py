"""The claims a pool holds, and keeping their leases alive.

A claim is held from the moment the loop claims it until the loop learns how
it ended, whether a thread is running its handler, it waits in the queue for
a thread, or its success waits for the next batch. Every one of them is
renewed every ``renew`` seconds, measured from when the claim was *sent*, so
our view of the lease never outlives the database's.

A renewal the database refuses means the claim is gone, unless the pool
itself just ended it: a result being recorded (``recorder.py``) or a
handler's ``attempt.atomic()`` also ends the lease. Such a claim is only no
longer renewed; the fenced write of its result says whether it still held.

The loop asks the table for its next renewal on every turn, and a pool with a
local queue holds hundreds of claims, most of them claimed together: the
renewal times are kept in a heap (stale entries skipped as they surface), so
a turn with nothing to renew costs the same for ten claims as for a thousand.

The table also times the attempts out (SPEC §16). An attempt's time starts
when its handler is called, not when it was claimed: a claim waiting for a
thread or a slot has not begun. Past its timeout, ``attempt.cancelled`` is
set (an async handler's task is cancelled by the event loop itself); from
then on its result is a timeout, a failure retried with the usual backoff
or cancelled at ``MAX_ATTEMPTS``, whatever the handler returns. A handler
still running the pool's grace period later is given up on: its result is
recorded as that timeout at once, and whatever it returns later is
dropped. Until it does return, its thread (or event-loop slot) stays taken,
so ``--workers`` and ``--concurrency`` keep bounding what runs: a handler
that never returns costs its pool one worker, not more. The checks sit in
a heap like the renewals, each claim's next check no later than its
deadline, so an attempt is timed out within one turn of the loop.

Only the loop thread calls this table.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterable

from django_intents.managers import IntentManager
from django_intents.signals import Outcome
from django_intents.worker import log
from django_intents.worker.execution import Claim, timeout_text


class LeaseTable:
    """The pool's claims by claim token (one intent may be claimed twice), with their renewals."""

    def __init__(
        self,
        manager: IntentManager,
        *,
        lease: float,
        renew: float,
        reached: Callable[[], None],
    ) -> None:
        self._manager = manager
        self._lease = lease
        self._renew = renew
        self._reached = reached  # called after each round trip, for liveness
        self._held: dict[str, Claim] = {}
        self._renew_at: dict[str, float] = {}
        self._renewals: list[tuple[float, str]] = []  # heap of (renew_at, token), some stale
        # Claims whose handler has not returned yet, threads' and awaited ones apart.
        self._busy = {False: 0, True: 0}
        self._returned: set[str] = set()  # handler returned; the result awaits recording
        # Timeouts: heap of (check_at, token), some stale; the claims past their
        # timeout (cancelled, their result a timeout); the claims given up on,
        # by token, whose handler still runs and holds its thread or slot.
        self._timeouts: list[tuple[float, str]] = []
        self._overdue: set[str] = set()
        self._stuck: dict[str, Claim] = {}

    def __len__(self) -> int:
        return len(self._held)

    def busy(self, awaited: bool) -> int:
        """Claims of async handlers (``awaited``) or of threads whose handler still runs or waits.

        A claim whose handler returned takes no room any more, though its
        lease is kept (and renewed) until its result is recorded.
        """
        return self._busy[awaited]

    def returned(self, claim: Claim) -> bool:
        """Note that the claim's handler returned: its room is free for the next claim.

        Returns False when its result is to be dropped: the handler was given
        up on past its timeout, and its timeout already recorded. A handler
        past its timeout but not given up on has its result made a timeout.
        """
        token = claim.intent.claim_token
        if self._stuck.get(token) is claim:
            del self._stuck[token]
            self._busy[claim.awaited] -= 1
            log.info("%s: returned after it was given up on; its result dropped", claim.name)
            return False
        if token in self._overdue and claim.outcome is not Outcome.TIMEOUT:
            log.info("%s: returned past its timeout; its result dropped", claim.name)
            claim.outcome, claim.cause = Outcome.TIMEOUT, timeout_text(claim.timeout or 0.0)
        if token in self._held and token not in self._returned:
            self._returned.add(token)
            self._busy[claim.awaited] -= 1
        return True

    def claims(self) -> list[Claim]:
        return list(self._held.values())

    def handing_back(self) -> bool:
        """Whether a handler has returned whose claim its thread has yet to hand back
        (it does so right after writing the outcome); a lost claim's result is dropped."""
        return any(
            claim.outcome is not None and not claim.attempt.lost and token not in self._returned
            for token, claim in self._held.items()
        )

    def add(self, claim: Claim, *, sent: float) -> None:
        """Hold a claim sent to the database at ``sent``."""
        token = claim.intent.claim_token
        claim.lease_end = sent + self._lease
        self._held[token] = claim
        self._schedule(token, sent + self._renew)
        self._busy[claim.awaited] += 1
        if claim.timeout is not None:
            # The handler starts after the claim is sent: the deadline is not earlier.
            self._time(token, sent + claim.timeout)

    def holds(self, claim: Claim) -> bool:
        return claim.intent.claim_token in self._held

    def drop(self, claim: Claim) -> None:
        """Forget a claim whose outcome is known."""
        token = claim.intent.claim_token
        if self._held.pop(token, None) is not None:
            if token in self._returned:
                self._returned.discard(token)
            else:
                self._busy[claim.awaited] -= 1
        self._renew_at.pop(token, None)
        self._overdue.discard(token)

    def _schedule(self, token: str, at: float) -> None:
        self._renew_at[token] = at
        if at < math.inf:
            heapq.heappush(self._renewals, (at, token))
        if len(self._renewals) > 2 * len(self._renew_at) + 64:
            # Stale entries behind a long-held claim surface only when it is
            # renewed; rebuilt from the live times, the heap stays the size
            # of what is held, however many claims came and went meanwhile.
            self._renewals = [(t, k) for k, t in self._renew_at.items() if t < math.inf]
            heapq.heapify(self._renewals)

    def next_renewal(self) -> float:
        heap = self._renewals
        while heap and self._renew_at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # dropped, rescheduled or never to be renewed again
        return heap[0][0] if heap else math.inf

    def _time(self, token: str, at: float) -> None:
        heapq.heappush(self._timeouts, (at, token))
        if len(self._timeouts) > 2 * len(self._held) + 64:
            # Dropped claims leave their entry behind until it surfaces: kept
            # to the live ones, the heap stays the size of what is held.
            self._timeouts = [(t, k) for t, k in self._timeouts if k in self._held]
            heapq.heapify(self._timeouts)

    def next_timeout(self) -> float:
        """When the next attempt may reach its timeout, or its grace after it."""
        heap = self._timeouts
        while heap and heap[0][1] not in self._held:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def time_out(self, grace: float) -> list[Claim]:
        """Cancel the attempts past their timeout; give up on those past it by ``grace`` too.

        Returns the results of those given up on, as the loop records them:
        copies of their claims with a timeout as the outcome, which the
        handler, still running, cannot overwrite.
        """
        given_up = []
        while self.next_timeout() <= (now := time.monotonic()):
            _, token = heapq.heappop(self._timeouts)
            claim = self._held[token]
            timeout = claim.timeout or 0.0
            if claim.outcome is not None:
                continue  # returned (a copy given up on, too): the loop collects it
            if claim.started is None:
                self._time(token, now + timeout)  # not begun: its time is still whole
                continue
            end = claim.started + timeout
            if now < end:
                self._time(token, end)
            elif token not in self._overdue:
                self._overdue.add(token)
                claim.attempt.mark_cancelled()
                self._time(token, end + grace)
                log.warning(
                    "%s: timed out after %s s; attempt cancelled, its result counts as a "
                    "failure; given up on in %s s if still running",
                    claim.name,
                    timeout,
                    grace,
                )
            elif now < end + grace:
                self._time(token, end + grace)
            else:
                given_up.append(self._give_up(token, claim, now, grace))
        return given_up

    def _give_up(self, token: str, claim: Claim, now: float, grace: float) -> Claim:
        """Hold the timeout recorded in place of the claim; its handler keeps its room."""
        result = dataclasses.replace(
            claim,
            outcome=Outcome.TIMEOUT,
            cause=timeout_text(claim.timeout or 0.0),
            duration=now - (claim.started or now),
        )
        self._held[token] = result
        self._stuck[token] = claim
        self._returned.add(token)  # recording the result frees no room: the handler has it
        self._overdue.discard(token)
        log.warning(
            "%s: still running %s s after its timeout; recorded as a timeout, the handler "
            "left to finish (it keeps its worker until it does) and its result dropped",
            claim.name,
            grace,
        )
        return result

    def renew_due(self) -> list[Claim]:
        """Renew every lease that is due; return the claims whose renewal was refused."""
        refused = []
        while self.next_renewal() <= (now := time.monotonic()):
            due = heapq.heappop(self._renewals)
            token = due[1]
            claim = self._held[token]
            if now >= claim.lease_end:
                # Another worker may hold it by now; the result must not count.
                self.lose(claim, "its lease ran out before it could be renewed")
                continue
            try:
                renewed = self._manager.renew(claim.intent.id, token, lease=self._lease)
            except BaseException:
                heapq.heappush(self._renewals, due)  # still due: the next turn tries again
                raise
            self._reached()
            if renewed:
                self._schedule(token, now + self._renew)
                claim.lease_end = now + self._lease
            else:
                self._renew_at[token] = math.inf
                refused.append(claim)
        return refused

    def refused(self, claims: Iterable[Claim]) -> None:
        """Settle refused renewals: the claims are gone, unless their result ended them."""
        for claim in claims:
            if claim.attempt.completed or claim.outcome is not None:
                # Its result is being recorded, which ends the lease too; the
                # fenced write says whether the claim still held.
                self._renew_at[claim.intent.claim_token] = math.inf
            else:
                self.lose(claim, "it was retried, cancelled or taken over meanwhile")

    def lose(self, claim: Claim, why: str) -> None:
        """Cancel the attempt of a claim that is gone; its result will be dropped."""
        claim.attempt.mark_lost()
        self._renew_at[claim.intent.claim_token] = math.inf
        log.warning("%s: claim lost, %s; attempt cancelled, its result dropped", claim.name, why)

    def abandon(self, *, unrecorded: int) -> None:
        """Cancel every attempt when nothing can be released, and say what is left behind."""
        for claim in self._held.values():
            claim.attempt.mark_lost()
        if self._held:
            log.error(
                "%d attempt result(s) could not be recorded and %d intent(s) stay running "
                "until their leases expire, then run again",
                unrecorded,
                len(self._held),
            )
