"""Successes recorded in batches, by the loop, instead of one commit per intent.

A worker thread hands a success back (``COMPLETING``) rather than completing
the intent itself; each turn the loop completes every success handed back
since in one fenced statement (``complete_many``). A busy pool thus costs the
database about two statements per loop turn however many handlers finished.
Failures, which are rare and need their own backoff and error text, are still
recorded one by one by the thread that saw them.

Only the loop thread calls the completer.
"""

from __future__ import annotations

import logging

from .execution import Claim, send_finished
from .managers import IntentManager
from .signals import Outcome

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


class Completer:
    """The successes handed back and not yet recorded."""

    def __init__(self, manager: IntentManager) -> None:
        self._manager = manager
        self._waiting: list[Claim] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, claim: Claim) -> None:
        self._waiting.append(claim)

    def complete(self) -> list[tuple[Claim, Outcome]]:
        """Record the successes so far in one fenced statement; return each one's outcome.

        Raises the database's error with nothing recorded and everything kept
        for the next call.
        """
        batch: list[Claim] = []
        later: list[Claim] = []
        ids: set[str] = set()
        for claim in self._waiting:
            # complete_many answers by id: a second claim of one intent waits a turn.
            (later if claim.intent.id in ids else batch).append(claim)
            ids.add(claim.intent.id)
        done = set(
            self._manager.complete_many([(c.intent.id, c.intent.claim_token) for c in batch])
        )
        self._waiting = later
        results = []
        for claim in batch:
            if claim.intent.id in done:
                outcome = Outcome.SUCCESS
            else:
                log.info("%s: result dropped, the claim was lost", claim.name)
                outcome = Outcome.FENCED
            results.append((claim, outcome))
            send_finished(claim, outcome)
        return results
