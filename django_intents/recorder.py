"""Every result of a pool recorded by its loop, in batches, on the pool's own connection.

Worker threads and coroutines only hand their claims back with an outcome
(``execution.py``); each turn the loop records all of them at once: the
successes in one fenced ``complete_many``, the failures, ``Stop``s and
releases in one fenced ``finish_many``. The pool knows each claim's attempt
number (the claim counted it, and the token fences it), so it decides retry
or cancellation, and the backoff, without asking the database. A busy pool
thus costs the database about two statements per turn however many
handlers finished, and a pool whose every handler fails costs no more than
one whose every handler succeeds.

Only the loop thread calls the recorder.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from .backends.base import Ending
from .execution import Claim, send_finished
from .managers import IntentManager
from .outage import one_line
from .retries import backoff, gives_up
from .signals import Outcome
from .states import State

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


class Recorder:
    """The results handed back and not yet recorded."""

    def __init__(self, manager: IntentManager, *, max_attempts: int | None) -> None:
        self._manager = manager
        self._max_attempts = max_attempts
        self._waiting: list[Claim] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, claim: Claim) -> Outcome | None:
        """Take a finished claim; return its outcome at once when there is nothing to record."""
        attempt = claim.attempt
        if attempt.completed:
            if claim.outcome is not Outcome.SUCCESS:
                log.warning(
                    "%s: failed after attempt.atomic() completed it: %s",
                    claim.name,
                    one_line(claim.cause),
                )
            return Outcome.SUCCESS
        if attempt.lost:
            if claim.outcome is not Outcome.FENCED or claim.cause:
                log.info("%s: result dropped, the claim was lost", claim.name)
            return Outcome.FENCED
        self._waiting.append(claim)
        return None

    def record(self) -> list[tuple[Claim, Outcome]]:
        """Record the results so far; return each one's outcome as it was recorded.

        Raises the database's error with nothing recorded and everything kept
        for the next call.
        """
        batch: list[Claim] = []
        later: list[Claim] = []
        ids: set[str] = set()
        for claim in self._waiting:
            # Both batches answer by id: a second claim of one intent waits a turn.
            (later if claim.intent.id in ids else batch).append(claim)
            ids.add(claim.intent.id)
        successes = [c for c in batch if c.outcome is Outcome.SUCCESS]
        others = [c for c in batch if c.outcome is not Outcome.SUCCESS]
        now = timezone.now()
        endings = [self._ending(claim, now) for claim in others]
        done: set[str] = set()
        both = successes and endings
        with transaction.atomic(using=self._manager.db) if both else contextlib.nullcontext():
            if successes:
                pairs = [(c.intent.id, c.intent.claim_token) for c in successes]
                done.update(self._manager.complete_many(pairs, now=now))
            if endings:
                done.update(self._manager.finish_many(endings, now=now))
        self._waiting = later
        results = []
        for claim, ending in [*((c, None) for c in successes), *zip(others, endings, strict=True)]:
            outcome = self._recorded(claim, ending) if claim.intent.id in done else None
            if outcome is None:
                log.info("%s: result dropped, the claim was lost", claim.name)
                outcome = Outcome.FENCED
            results.append((claim, outcome))
            send_finished(claim, outcome)
        return results

    def _ending(self, claim: Claim, now: datetime) -> Ending:
        """The transition a failure, a ``Stop`` or a handler given up at shutdown ends with."""
        intent = claim.intent
        id, token = intent.id, intent.claim_token
        if claim.outcome is Outcome.FENCED:
            # ClaimLost while the claim still holds: the handler gave up at shutdown.
            return Ending(id, token, State.PENDING, next_at=now)
        if claim.outcome is Outcome.STOPPED or gives_up(intent.attempts, self._max_attempts):
            return Ending(id, token, State.CANCELLED, error=claim.cause or "")
        return Ending(
            id, token, State.PENDING, next_at=now + backoff(id, intent.attempts), error=claim.cause
        )

    def _recorded(self, claim: Claim, ending: Ending | None) -> Outcome:
        """Say in the log how a recorded result ended; return its outcome."""
        outcome = claim.outcome or Outcome.ERROR
        if outcome is Outcome.ERROR and ending is not None:
            if ending.state == State.CANCELLED:
                then = f"cancelled, MAX_ATTEMPTS ({self._max_attempts}) reached"
            else:
                wait = backoff(claim.intent.id, claim.intent.attempts).total_seconds()
                then = f"retry in {wait:.0f} s"
            log.warning("%s: failed: %s; %s", claim.name, one_line(claim.cause), then)
        elif outcome is Outcome.STOPPED:
            log.warning(
                "%s: stopped by its handler, cancelled: %s", claim.name, one_line(claim.cause)
            )
        elif outcome is Outcome.FENCED:
            log.info("%s: handler stopped for shutdown; released, due now", claim.name)
        return outcome
