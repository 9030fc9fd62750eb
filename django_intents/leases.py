"""The claims a pool holds, and keeping their leases alive.

A claim is held from the moment the loop claims it until the loop learns how
it ended, whether a thread is running its handler, it waits in the queue for
a thread, or its success waits for the next batch. Every one of them is
renewed every ``renew`` seconds, measured from when the claim was *sent*, so
our view of the lease never outlives the database's.

A renewal the database refuses means the claim is gone: the loop records
every result itself before it renews, so no transition of the pool's own
can have ended it (only a handler's ``attempt.atomic()``, whose attempt
then says ``completed`` and keeps its success).

Only the loop thread calls this table.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

from .execution import Claim
from .managers import IntentManager

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


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
        self._awaited = 0  # how many of the claims are async handlers' (``Claim.awaited``)

    def __len__(self) -> int:
        return len(self._held)

    def awaited(self) -> int:
        """How many held claims are awaited on the event loop; the rest are the threads'."""
        return self._awaited

    def claims(self) -> list[Claim]:
        return list(self._held.values())

    def add(self, claim: Claim, *, sent: float) -> None:
        """Hold a claim sent to the database at ``sent``."""
        token = claim.intent.claim_token
        claim.lease_end = sent + self._lease
        self._held[token] = claim
        self._renew_at[token] = sent + self._renew
        self._awaited += claim.awaited

    def holds(self, claim: Claim) -> bool:
        return claim.intent.claim_token in self._held

    def drop(self, claim: Claim) -> None:
        """Forget a claim whose outcome is known."""
        token = claim.intent.claim_token
        if self._held.pop(token, None) is not None:
            self._awaited -= claim.awaited
        self._renew_at.pop(token, None)

    def next_renewal(self) -> float:
        return min(self._renew_at.values(), default=math.inf)

    def renew_due(self) -> list[Claim]:
        """Renew every lease that is due; return the claims whose renewal was refused."""
        refused = []
        for token, claim in list(self._held.items()):
            now = time.monotonic()
            if now < self._renew_at[token]:
                continue
            if now >= claim.lease_end:
                # Another worker may hold it by now; the result must not count.
                self.lose(claim, "its lease ran out before it could be renewed")
                continue
            renewed = self._manager.renew(claim.intent.id, token, lease=self._lease)
            self._reached()
            if renewed:
                self._renew_at[token], claim.lease_end = now + self._renew, now + self._lease
            else:
                refused.append(claim)
        return refused

    def refused(self, claims: Iterable[Claim]) -> None:
        """Settle refused renewals: the claims are gone, unless ``attempt.atomic()`` ended them."""
        for claim in claims:
            if claim.attempt.completed:
                self._renew_at[claim.intent.claim_token] = math.inf
            else:
                self.lose(claim, "it was retried, cancelled or taken over meanwhile")

    def lose(self, claim: Claim, why: str) -> None:
        """Cancel the attempt of a claim that is gone; its result will be dropped."""
        claim.attempt._lose()
        self._renew_at[claim.intent.claim_token] = math.inf
        log.warning("%s: claim lost, %s; attempt cancelled, its result dropped", claim.name, why)

    def abandon(self) -> None:
        """Cancel every attempt when nothing can be released: the leases will expire."""
        for claim in self._held.values():
            claim.attempt._lose()
