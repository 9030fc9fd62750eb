"""What a worker thread does with one claimed intent: run its handler, record the result.

The pool's loop (``worker.py``) claims, renews and batches; this module is the
other side of its queue. A handler's outcome becomes one fenced transition:
``retry`` for an error, ``cancel_claim`` for ``Stop``, ``release`` for a
handler that gave up at shutdown. A success is handed back to the loop
(``COMPLETING``), which records the successes of all threads in one statement.
A transition that finds the claim taken over changes nothing and the attempt
counts as ``fenced``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections

from .attempt import Attempt
from .exceptions import ClaimLost, Stop
from .handlers import Handler
from .managers import IntentManager
from .models import Intent
from .retries import backoff
from .signals import attempt_finished

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")

COMPLETING = "completing"  # a success handed to the loop, to be recorded in a batch
MAX_RETRY_DELAY = 5.0


@dataclass(eq=False)
class Claim:
    """A claimed intent while its handler runs. Times are ``time.monotonic()``."""

    intent: Intent
    attempt: Attempt
    handler: Handler
    renew_at: float
    lease_end: float  # our own view of claim_until, measured before the claim was sent
    finishing: bool = False  # the handler returned; its result is being recorded
    duration: float = 0.0  # of the handler, for attempt_finished once the success is recorded

    @property
    def name(self) -> str:
        return f"{self.intent.kind} {self.intent.id[:12]} (attempt {self.intent.attempts})"


class Executor:
    """Runs handlers for one pool; shared by its worker threads, holds no state of theirs."""

    def __init__(
        self,
        manager: IntentManager,
        *,
        using: str,
        max_attempts: int | None,
        db_error_timeout: float,
    ) -> None:
        self._manager = manager
        self._using = using
        self._max_attempts = max_attempts
        self._db_error_timeout = db_error_timeout

    def run(self, claim: Claim) -> str:
        """Run one handler and record its result; return the attempt's outcome."""
        intent = claim.intent
        if claim.attempt.lost or time.monotonic() >= claim.lease_end:
            # It waited in the pool's queue while its claim was lost: retried or
            # cancelled meanwhile, or its lease ran out. Another worker may own it.
            claim.attempt._lose()
            claim.finishing = True
            log.info("%s: not started, the claim was lost while it waited", claim.name)
            send_finished(claim, "fenced")
            return "fenced"
        close_old_connections()
        cause = None
        started = time.monotonic()
        try:
            claim.handler(intent, claim.attempt)
        except ClaimLost:
            outcome = "fenced"
        except Stop as exc:
            outcome, cause = "stopped", str(exc)
        except BaseException as exc:  # a handler's failure is a result, never a dead thread
            outcome, cause = "error", error_text(exc)
            log.debug("%s: traceback", claim.name, exc_info=True)
            if isinstance(exc, DatabaseFailure):
                # The handler may have broken this thread's connection, and the
                # result is about to be recorded through it.
                with contextlib.suppress(DatabaseFailure):
                    connections[self._using].close_if_unusable_or_obsolete()
        else:
            outcome = "success"
        claim.duration = time.monotonic() - started
        claim.finishing = True
        if outcome == "success" and not (claim.attempt.completed or claim.attempt.lost):
            close_old_connections()
            return COMPLETING  # the loop records it, together with the others
        outcome = self._record(claim, outcome, cause)
        send_finished(claim, outcome)
        close_old_connections()
        return outcome

    def _record(self, claim: Claim, outcome: str, cause: str | None) -> str:
        """Apply the fenced transition for ``outcome``; return what really happened."""
        attempt, intent = claim.attempt, claim.intent
        if attempt.completed:
            if outcome != "success":
                log.warning(
                    "%s: failed after attempt.atomic() completed it: %s",
                    claim.name,
                    one_line(cause),
                )
            return "success"
        if attempt.lost:
            log.info("%s: result dropped, the claim was lost", claim.name)
            return "fenced"
        manager, id, token = self._manager, intent.id, intent.claim_token
        if outcome == "fenced":
            # ClaimLost while the claim still holds: the handler gave up at shutdown.
            if self._transition(claim, functools.partial(manager.release, id, token)):
                log.info("%s: handler stopped for shutdown; released, due now", claim.name)
            return "fenced"
        transition = {
            # Successes normally go to the loop's batch (COMPLETING); kept for completeness.
            "success": functools.partial(manager.complete, id, token),
            "error": functools.partial(manager.retry, id, token, cause),
            "stopped": functools.partial(manager.cancel_claim, id, token, cause),
        }[outcome]
        done = self._transition(claim, transition)
        if done is False:
            if cause is not None:
                log.warning(
                    "%s: failed: %s; result dropped, the claim was lost",
                    claim.name,
                    one_line(cause),
                )
            else:
                log.info("%s: result dropped, the claim was lost", claim.name)
            return "fenced"
        if outcome == "error":
            if self._max_attempts is not None and intent.attempts >= self._max_attempts:
                then = f"cancelled, MAX_ATTEMPTS ({self._max_attempts}) reached"
            else:
                then = f"retry in {backoff(id, intent.attempts).total_seconds():.0f} s"
            log.warning("%s: failed: %s; %s", claim.name, one_line(cause), then)
        elif outcome == "stopped":
            log.warning("%s: stopped by its handler, cancelled: %s", claim.name, one_line(cause))
        return outcome

    def _transition(self, claim: Claim, transition: Callable[[], bool]) -> bool | None:
        """Run a fenced transition, retrying database errors; ``None`` if it never got through."""
        give_up = time.monotonic() + self._db_error_timeout
        delay = 0.1
        while True:
            try:
                return transition()
            except DatabaseFailure as exc:
                with contextlib.suppress(DatabaseFailure):
                    connections[self._using].close()
                if claim.attempt.lost:
                    return False
                if time.monotonic() + delay > give_up:
                    log.error(
                        "%s: result not recorded (%s); it runs again once its lease expires",
                        claim.name,
                        cause_text(exc),
                    )
                    return None
                log.warning(
                    "%s: database error, retrying in %.1f s: %s",
                    claim.name,
                    delay,
                    cause_text(exc),
                )
                time.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)


def send_finished(claim: Claim, outcome: str) -> None:
    intent = claim.intent
    for receiver, error in attempt_finished.send_robust(
        sender=Intent, kind=intent.kind, outcome=outcome, duration=claim.duration, intent=intent
    ):
        if isinstance(error, Exception):
            log.error("attempt_finished receiver %r failed: %s", receiver, cause_text(error))


def error_text(exc: BaseException) -> str:
    """``Type: message``: what ``last_error`` keeps of a handler's exception."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def cause_text(exc: BaseException) -> str:
    """The error text on one line, the way the pool logs it."""
    return one_line(error_text(exc))


def one_line(text: str | None) -> str:
    return " ".join((text or "").split())
