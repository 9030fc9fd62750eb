"""Running a handler on one claimed intent: in a worker thread, or awaited on the event loop.

The pool's loop (``pool.py``) claims, renews and records; this module is
the other side. A sync handler runs in one of the pool's worker threads,
which take ``Claim`` objects from ``jobs``; an async one is awaited on the
pool's event loop (``eventloop.py``). Either way the handler's outcome is
written on the claim and the claim is put on ``finished``, and nothing else:
the loop records every result, success or failure, in batches on the pool's
own connection (``recorder.py``). A worker thread therefore never opens a
database connection unless its handler uses the ORM itself, and a pool's
connections stay a small constant whatever ``--workers`` and
``--concurrency`` say (SPEC §9): an outage of a partner that makes every
handler fail costs the database nothing more than success does.
"""

from __future__ import annotations

import contextlib
import inspect
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections

from django_intents.attempt import Attempt
from django_intents.exceptions import ClaimLost, Retry, Stop
from django_intents.handlers import Handler
from django_intents.models import Intent
from django_intents.rules.validation import exception_text, traceback_text
from django_intents.signals import Outcome, attempt_finished
from django_intents.store.clock import server_now
from django_intents.tracing import processing
from django_intents.worker import log
from django_intents.worker.outage import cause_text


@dataclass(eq=False)
class Claim:
    """A claimed intent on its way through the pool. Times are ``time.monotonic()``.

    Only the loop writes ``lease_end`` (the lease table, as it renews); the
    thread or coroutine reads it once, before it starts the handler, writes
    ``started`` as it does (the loop reads it to time the attempt out), and
    then writes ``outcome``, ``cause``, ``duration`` and, for a snooze,
    ``due`` before it hands the claim back.
    """

    intent: Intent
    attempt: Attempt
    handler: Handler
    awaited: bool = False  # an async handler, on the event loop; else a thread's
    lease_end: float = 0.0  # our view of claim_until, measured before the claim was sent
    outcome: Outcome | None = None  # None while the handler has not returned
    cause: str | None = None  # the error text of a failure or a Stop
    duration: float = 0.0  # of the handler, for attempt_finished once the result is recorded
    due: datetime | None = None  # a snooze's due time, from when the handler ended
    hold: bool = False  # the snooze holds the intent's target until ``due`` (hold_target)
    traceback: str | None = None  # of a failure, its tail: the intent's last_traceback
    timeout: float | None = None  # seconds the handler may run (LIMITS, --timeout-per-attempt)
    started: float | None = None  # when the handler was called; None while it waits
    paced: bool = False  # a rated or ordered kind's, claimed beside others: first in the queue

    @property
    def name(self) -> str:
        return f"{self.intent.kind} {self.intent.id[:12]} (attempt {self.intent.attempts})"

    def startable(self) -> bool:
        """False (and the claim handed back as fenced) if it was lost while it waited."""
        if not self.attempt.lost and time.monotonic() < self.lease_end:
            return True
        # It waited in the pool's queue while its claim was lost: retried or
        # cancelled meanwhile, or its lease ran out. Another worker may own it.
        self.attempt.mark_lost()
        log.info("%s: not started, the claim was lost while it waited", self.name)
        self.outcome = Outcome.FENCED
        return False

    def ended(self, started: float, error: BaseException | None) -> None:
        """Write the handler's outcome from what it raised (``None``: it returned)."""
        self.duration = time.monotonic() - started
        self.outcome, self.cause = outcome_of(error)
        if self.outcome is Outcome.SNOOZED:
            # Measured here, not when the batch is recorded: "after 30 s" means
            # 30 s from the handler's raise, however long the result waits.
            self.due = cast(Retry, error).due(server_now(self.intent._state.db, read=False))
            self.hold = cast(Retry, error).hold_target
        if self.outcome is Outcome.ERROR and error is not None:
            self.traceback = traceback_text(error)

    def timed_out(self, started: float) -> None:
        """Write a timeout as the outcome, whatever the handler did past its time."""
        self.duration = time.monotonic() - started
        self.outcome, self.cause = Outcome.TIMEOUT, timeout_text(self.timeout or 0.0)


def timeout_text(timeout: float) -> str:
    """What ``last_error`` says of an attempt cancelled at its timeout."""
    return f"timed out after {timeout} s"


def outcome_of(error: BaseException | None) -> tuple[Outcome, str | None]:
    """A handler's outcome and error text: the handler contract in one place."""
    if error is None:
        return Outcome.SUCCESS, None
    if isinstance(error, ClaimLost):
        return Outcome.FENCED, None
    if isinstance(error, Stop):
        return Outcome.STOPPED, str(error)
    if isinstance(error, Retry):
        return (Outcome.ERROR if error.after is None else Outcome.SNOOZED), error.reason
    return Outcome.ERROR, exception_text(error)


def is_async(handler: Handler) -> bool:
    """Whether the pool awaits this handler on its event loop instead of calling it in a thread."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - a callable object's async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def resolve(handler: Handler, intent: Intent) -> Handler:
    """What runs this intent: the handler, or what it chooses for the intent.

    One kind may hold sync and async work (django.tasks tasks share a kind):
    its handler then has a ``for_intent(intent)`` that picks the callable,
    which the pool awaits on its event loop when it is ``async def``.
    """
    choose = getattr(handler, "for_intent", None)
    return handler if choose is None else choose(intent)


def needs_event_loop(handlers: Iterable[Handler]) -> bool:
    """Whether a pool with these handlers awaits anything: an async handler, or one that
    picks a callable per intent (``resolve``), which may be async."""
    return any(is_async(h) or hasattr(h, "for_intent") for h in handlers)


Jobs = queue.SimpleQueue[Claim | None]  # None ends a thread
Finished = queue.SimpleQueue[Claim]


class Executor:
    """Runs sync handlers for one pool; shared by its worker threads, holds no state of theirs."""

    def __init__(self, *, using: str) -> None:
        self._using = using

    def start(
        self, count: int, jobs: Jobs, finished: Finished, wake: Callable[[], None]
    ) -> list[threading.Thread]:
        """Start ``count`` worker threads serving ``jobs``."""
        threads = [
            threading.Thread(
                target=self.serve,
                args=(jobs, finished, wake),
                name=f"intents-worker-{n}",
                daemon=True,
            )
            for n in range(1, count + 1)
        ]
        for thread in threads:
            thread.start()
        return threads

    def stop(self, threads: list[threading.Thread], jobs: Jobs, until: float) -> None:
        """End the threads, waiting for them until ``until`` (``time.monotonic()``) at most.

        Idle threads exit at once and close their connections; a thread stuck
        in a handler is a daemon and ends with the process.
        """
        for _ in threads:
            jobs.put(None)
        for thread in threads:
            thread.join(max(until - time.monotonic(), 0.0))

    def serve(self, jobs: Jobs, finished: Finished, wake: Callable[[], None]) -> None:
        """Be one worker thread: run the claims from ``jobs`` until a ``None`` arrives."""
        try:
            while (claim := jobs.get()) is not None:
                try:
                    self.run(claim)
                except Exception:  # a bug here must not cost the pool a worker for good
                    log.exception("%s: internal error in the worker", claim.name)
                    claim.outcome, claim.cause = Outcome.ERROR, "internal error in the worker"
                finished.put(claim)
                wake()
        finally:
            connections.close_all()

    def run(self, claim: Claim) -> None:
        """Run one handler and write its outcome on the claim."""
        if not claim.startable():
            return
        with processing(claim):
            self._run(claim)

    def _run(self, claim: Claim) -> None:
        claim.started = started = time.monotonic()
        error: BaseException | None = None
        try:
            result = claim.handler(claim.intent, claim.attempt)
            if inspect.isawaitable(result):
                # A sync wrapper around an async function: never awaited here.
                if inspect.iscoroutine(result):
                    result.close()
                raise TypeError(
                    f"the handler returned {type(result).__name__}, an awaitable that this worker "
                    "thread cannot await; declare the handler with async def"
                )
        except BaseException as exc:  # a handler's failure is a result, never a dead thread
            error = exc
            if isinstance(exc, DatabaseFailure):
                # The handler may have broken this thread's connection.
                with contextlib.suppress(DatabaseFailure):
                    connections[self._using].close_if_unusable_or_obsolete()
        finally:
            # A handler's own ORM use follows CONN_MAX_AGE, as in a request.
            close_old_connections()
        claim.ended(started, error)
        # The exception's traceback holds this frame, which holds the exception:
        # break the cycle here rather than leave it to the garbage collector.
        error = None


def send_finished(claim: Claim, outcome: Outcome) -> None:
    intent = claim.intent
    for receiver, error in attempt_finished.send_robust(
        sender=Intent,
        kind=intent.kind,
        outcome=outcome,
        duration=claim.duration,
        intent=intent,
        database=intent._state.db,
    ):
        if isinstance(error, Exception):
            log.error("attempt_finished receiver %r failed: %s", receiver, cause_text(error))
