"""Stopping a pool without losing or delaying any intent.

A stop (``WorkerPool.stop()``, SIGTERM or SIGINT) ends claiming at once and
sets ``attempt.cancelled`` on every running attempt, asking handlers that
check it to wind down; the intents themselves are not cancelled. Claims that
no thread has started are released unstarted. Handlers then have the grace
period to finish, and their results are recorded as usual; whatever still
runs after it is released (pending, due now), so that no intent waits for its
lease to expire. A second signal ends the grace period.

``request()`` may be called from any thread or a signal handler; it only puts
the deadline on a ``SimpleQueue`` (whose ``put`` is safe there) and rings the
alarm. The loop reads the queue; everything else here runs in the loop thread.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from django.db import Error as DatabaseFailure

from django_intents.managers import IntentManager
from django_intents.rules.states import State
from django_intents.store.base import Ending
from django_intents.store.clock import server_now
from django_intents.worker import log
from django_intents.worker.execution import Claim
from django_intents.worker.leases import LeaseTable
from django_intents.worker.outage import cause_text
from django_intents.worker.queues import Queued
from django_intents.worker.wakeup import Alarm

# Seconds a worker thread may take, at most, between a handler's return and its hand-back.
HANDED_BACK_WITHIN = 1.0


class Shutdown:
    """When the pool must stop, and the releases that go with it."""

    def __init__(self, manager: IntentManager, *, grace: float, alarm: Alarm) -> None:
        self._manager = manager
        self._grace = grace
        self._alarm = alarm
        self._requests: queue.SimpleQueue[float] = queue.SimpleQueue()
        self._deadline: float | None = None  # end of the grace period, once requested
        self._signal = ""
        self._begun = False

    def request(self, grace: float | None = None) -> None:
        """Ask the loop to stop within ``grace`` seconds; a later request can only shorten it."""
        self._requests.put(time.monotonic() + (self._grace if grace is None else grace))
        self._alarm.ring()

    def deadline(self) -> float | None:
        """The end of the grace period, or ``None`` while no stop was requested."""
        while True:
            try:
                deadline = self._requests.get_nowait()
            except queue.Empty:
                return self._deadline
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline

    @contextlib.contextmanager
    def signals_handled(self, enabled: bool) -> Iterator[None]:
        """Stop on SIGTERM and SIGINT meanwhile, when enabled and in the main thread."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First signal: stop gracefully. Second: release what still runs, now."""
        again = bool(self._signal) or self._deadline is not None
        self._signal = signal.Signals(signum).name
        self.request(grace=0.0 if again else None)

    def begin(self, queues: list[Queued], leases: LeaseTable) -> None:
        """Release the claims not started yet and ask the running attempts to stop, once.

        The line says what happens to the intents, since "cancelled" is also
        the name of a terminal state that a stop never moves an intent to.
        """
        if self._begun:
            return
        self._begun = True
        self._release_queued(queues, leases)
        for claim in leases.claims():
            claim.attempt.mark_cancelled()
        deadline = self._deadline if self._deadline is not None else time.monotonic()
        reason = f" on {self._signal}" if self._signal else ""
        if not leases:
            log.info("stopping%s: no new claims; no attempt running", reason)
            return
        log.info(
            "stopping%s: no new claims; %d running attempt(s) asked to stop "
            "(attempt.cancelled set); those unfinished in %.1f s are released, "
            "their intents back to pending, due now",
            reason,
            len(leases),
            max(deadline - time.monotonic(), 0.0),
        )

    def _release_queued(self, queues: list[Queued], leases: LeaseTable) -> None:
        """Give back the claims not started yet: pending again, due now, never run."""
        queued = [claim for jobs in queues for claim in jobs.take(jobs.qsize())]
        for claim in queued:
            leases.drop(claim)
        self.release(queued, started=False)

    def release_unfinished(self, leases: LeaseTable, collect: Callable[[], None]) -> None:
        """Give back every claim whose handler is still running (pending, due now), then
        ``collect`` those whose handler returned meanwhile.

        A claim whose handler has returned keeps it: its result is the
        recorder's to write (or, if the database is away, its lease expires).
        A handler may return after the loop's last look at the results and
        before this one, and be passed by: it is taken back here, to be
        recorded like the others, not left to run again after its lease.
        """
        self.release([claim for claim in leases.claims() if claim.outcome is None], started=True)
        until = time.monotonic() + HANDED_BACK_WITHIN
        collect()
        while leases.handing_back() and time.monotonic() < until:
            time.sleep(0.001)
            collect()

    def release(self, claims: list[Claim], *, started: bool) -> None:
        """Release ``claims`` in one statement; whatever their handlers return later is dropped."""
        if not claims:
            return
        for claim in claims:
            claim.attempt.mark_lost()  # an async handler's task is cancelled
        now = server_now(self._manager.db, read=False)
        endings = [
            Ending(
                c.intent.id, c.intent.claim_token, State.PENDING, next_at=now, unstarted=not started
            )
            for c in claims
        ]
        try:
            released = set(self._manager.finish_many(endings))
        except DatabaseFailure as exc:
            log.warning(
                "%d claim(s) %s (%s); they run %sonce their leases expire",
                len(claims),
                "not released" if started else "not started and not released",
                cause_text(exc),
                "again " if started else "",
            )
            return
        state = "handler still running" if started else "not started"
        if not started and len(claims) > 1:  # a pool's local queue: one line
            log.info("%d claims not started; released, due now", len(claims))
            return
        for claim in claims:
            if claim.intent.id in released or not started:
                log.info("%s: %s; released, due now", claim.name, state)
