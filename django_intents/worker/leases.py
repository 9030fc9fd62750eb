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

Only the loop thread calls this table.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable

from django_intents.managers import IntentManager
from django_intents.worker import log
from django_intents.worker.execution import Claim


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

    def __len__(self) -> int:
        return len(self._held)

    def busy(self, awaited: bool) -> int:
        """Claims of async handlers (``awaited``) or of threads whose handler still runs or waits.

        A claim whose handler returned takes no room any more, though its
        lease is kept (and renewed) until its result is recorded.
        """
        return self._busy[awaited]

    def returned(self, claim: Claim) -> None:
        """Note that the claim's handler returned: its room is free for the next claim."""
        token = claim.intent.claim_token
        if token in self._held and token not in self._returned:
            self._returned.add(token)
            self._busy[claim.awaited] -= 1

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
