"""What a worker thread does with one claimed intent: run its handler, record the result.

The pool's loop (``worker.py``) claims, renews and batches; this module is the
other side of its two queues. A thread takes a ``Claim`` from ``jobs`` and
tells the loop about it on ``finished``, in this order:

- ``COMPLETING``: the handler succeeded; the loop records the successes of
  all threads in one statement (``completer.py``). Nothing follows.
- ``RECORDING``, then an ``Outcome``: the thread records any other result
  itself, with one fenced transition (``retry`` for an error,
  ``cancel_claim`` for ``Stop``, ``release`` for a handler that gave up at
  shutdown), then says how it ended.
- an ``Outcome`` alone: the claim was lost before the handler started.
- ``RECORDING``, then ``UNRECORDED``: the database stayed away past
  ``DB_ERROR_TIMEOUT`` and the result was never recorded; the intent stays
  ``running`` until its lease expires, and a drain ends with status 1.

``RECORDING`` is put on the queue *before* the transition is sent, so when
the loop sees a renewal refused because that transition committed, the
message is already there to read: the loop then knows the claim is being
finished, not lost, and that it must not release it at shutdown. The queue
is the only way a thread tells the loop anything; a transition that finds
the claim taken over changes nothing and the attempt counts as ``fenced``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections

from .attempt import Attempt
from .exceptions import ClaimLost, Stop
from .handlers import Handler
from .managers import IntentManager
from .models import Intent
from .outage import Outage, cause_text, one_line
from .retries import backoff, gives_up
from .signals import Outcome, attempt_finished
from .validation import exception_text

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


class Progress(StrEnum):
    """What a worker thread tells the loop about a claim before (or instead of) an outcome."""

    RECORDING = "recording"  # the handler returned; this thread records the result now
    COMPLETING = "completing"  # a success, for the loop to record with the others
    UNRECORDED = "unrecorded"  # the result could not be recorded: the lease will expire


@dataclass(eq=False)
class Claim:
    """A claimed intent on its way through the pool. Times are ``time.monotonic()``.

    Only the loop writes ``lease_end`` (the lease table, as it renews); a
    thread reads it once, before it starts the handler. ``duration`` is
    written by the thread before it hands the claim back.
    """

    intent: Intent
    attempt: Attempt
    handler: Handler
    lease_end: float = 0.0  # our view of claim_until, measured before the claim was sent
    duration: float = 0.0  # of the handler, for attempt_finished once the success is recorded

    @property
    def name(self) -> str:
        return f"{self.intent.kind} {self.intent.id[:12]} (attempt {self.intent.attempts})"


Jobs = queue.SimpleQueue[Claim | None]  # None ends a thread
Finished = queue.SimpleQueue[tuple[Claim, Outcome | Progress]]


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

    def serve(self, jobs: Jobs, finished: Finished, wake: Callable[[], None]) -> None:
        """Be one worker thread: run the claims from ``jobs`` until a ``None`` arrives."""
        try:
            while (claim := jobs.get()) is not None:
                try:
                    self.run(claim, finished)
                except Exception:  # a bug here must not cost the pool a worker for good
                    log.exception("%s: internal error in the worker", claim.name)
                    finished.put((claim, Outcome.ERROR))
                wake()
        finally:
            connections.close_all()

    def run(self, claim: Claim, finished: Finished) -> None:
        """Run one handler, record its result and tell the loop (see the module docstring)."""
        if claim.attempt.lost or time.monotonic() >= claim.lease_end:
            # It waited in the pool's queue while its claim was lost: retried or
            # cancelled meanwhile, or its lease ran out. Another worker may own it.
            claim.attempt._lose()
            log.info("%s: not started, the claim was lost while it waited", claim.name)
            send_finished(claim, Outcome.FENCED)
            finished.put((claim, Outcome.FENCED))
            return
        close_old_connections()
        outcome, cause = self._call(claim)
        if outcome is Outcome.SUCCESS and not (claim.attempt.completed or claim.attempt.lost):
            close_old_connections()
            finished.put((claim, Progress.COMPLETING))
            return
        finished.put((claim, Progress.RECORDING))
        recorded = self._record(claim, outcome, cause)
        send_finished(claim, outcome if recorded is None else recorded)
        close_old_connections()
        finished.put((claim, Progress.UNRECORDED if recorded is None else recorded))

    def _call(self, claim: Claim) -> tuple[Outcome, str | None]:
        """Run the handler; return its outcome and, for a failure, the error text."""
        started = time.monotonic()
        try:
            claim.handler(claim.intent, claim.attempt)
        except ClaimLost:
            result: tuple[Outcome, str | None] = (Outcome.FENCED, None)
        except Stop as exc:
            result = (Outcome.STOPPED, str(exc))
        except BaseException as exc:  # a handler's failure is a result, never a dead thread
            result = (Outcome.ERROR, exception_text(exc))
            log.debug("%s: traceback", claim.name, exc_info=True)
            if isinstance(exc, DatabaseFailure):
                # The handler may have broken this thread's connection, and the
                # result is about to be recorded through it.
                with contextlib.suppress(DatabaseFailure):
                    connections[self._using].close_if_unusable_or_obsolete()
        else:
            result = (Outcome.SUCCESS, None)
        claim.duration = time.monotonic() - started
        return result

    def _record(self, claim: Claim, outcome: Outcome, cause: str | None) -> Outcome | None:
        """Apply the fenced transition for ``outcome``; return what really happened.

        ``None``: the database stayed away and nothing was recorded.
        """
        attempt, intent = claim.attempt, claim.intent
        if attempt.completed:
            if outcome is not Outcome.SUCCESS:
                log.warning(
                    "%s: failed after attempt.atomic() completed it: %s",
                    claim.name,
                    one_line(cause),
                )
            return Outcome.SUCCESS
        if attempt.lost:
            log.info("%s: result dropped, the claim was lost", claim.name)
            return Outcome.FENCED
        manager, id, token = self._manager, intent.id, intent.claim_token
        if outcome is Outcome.FENCED:
            # ClaimLost while the claim still holds: the handler gave up at shutdown.
            released = self._transition(claim, functools.partial(manager.release, id, token))
            if released is None:
                return None
            if released:
                log.info("%s: handler stopped for shutdown; released, due now", claim.name)
            return Outcome.FENCED
        transition = {
            # Successes normally go to the loop's batch (COMPLETING); kept for completeness.
            Outcome.SUCCESS: functools.partial(manager.complete, id, token),
            Outcome.ERROR: functools.partial(manager.retry, id, token, cause),
            Outcome.STOPPED: functools.partial(manager.cancel_claim, id, token, cause),
        }[outcome]
        done = self._transition(claim, transition)
        if done is None:
            return None
        if done is False:
            if cause is not None:
                log.warning(
                    "%s: failed: %s; result dropped, the claim was lost",
                    claim.name,
                    one_line(cause),
                )
            else:
                log.info("%s: result dropped, the claim was lost", claim.name)
            return Outcome.FENCED
        if outcome is Outcome.ERROR:
            if gives_up(intent.attempts, self._max_attempts):
                then = f"cancelled, MAX_ATTEMPTS ({self._max_attempts}) reached"
            else:
                then = f"retry in {backoff(id, intent.attempts).total_seconds():.0f} s"
            log.warning("%s: failed: %s; %s", claim.name, one_line(cause), then)
        elif outcome is Outcome.STOPPED:
            log.warning("%s: stopped by its handler, cancelled: %s", claim.name, one_line(cause))
        return outcome

    def _transition(self, claim: Claim, transition: Callable[[], bool]) -> bool | None:
        """Run a fenced transition through an outage; ``None`` if it never got through."""
        outage = Outage(
            using=self._using,
            timeout=self._db_error_timeout,
            then="result not recorded; it runs again once its lease expires",
            about=claim.name,
        )
        while True:
            try:
                return transition()
            except DatabaseFailure as exc:
                if claim.attempt.lost:
                    return False
                if outage.failed(exc):
                    return None


def send_finished(claim: Claim, outcome: Outcome) -> None:
    intent = claim.intent
    for receiver, error in attempt_finished.send_robust(
        sender=Intent, kind=intent.kind, outcome=outcome, duration=claim.duration, intent=intent
    ):
        if isinstance(error, Exception):
            log.error("attempt_finished receiver %r failed: %s", receiver, cause_text(error))
