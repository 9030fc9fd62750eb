"""The pool's event loop: where ``async def`` handlers are awaited, many at once.

One thread per pool runs an asyncio loop; the pool's loop hands it claims
with ``submit`` (thread-safe) and it starts one task per claim, at most
``--concurrency`` at once (its slots). Claims beyond them wait, in priority
order, and the next one starts the moment a task ends, without waiting for
the pool's loop to record and claim (``demand.py`` says how many the pool
claims ahead; it takes them back with ``take`` to give them back on a stall
or a stop). A coroutine's outcome goes back on the same ``finished`` queue
as a thread's, and the pool's loop records it: a thousand coroutines in
flight share the pool's few connections.

A claim that is lost (retried or cancelled by an administrator, or taken
over after its lease ran out) cancels its task: the handler sees
``asyncio.CancelledError`` at the ``await`` it is waiting on, its result is
dropped, and its slot is free at once. A handler that must clean up does so
in ``finally``. A stop is gentler: ``attempt.cancelled`` is set and
``await attempt.wait_cancelled()`` returns, the handler has the grace period
to finish, and only what still runs after it is cancelled and released.

An attempt that runs past its timeout (``LIMITS[kind]["timeout"]``,
``--timeout-per-attempt``) has its task cancelled too, and its outcome is
a timeout, a failure, whatever the handler does about the cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, cast

from django_intents.tracing import processing
from django_intents.worker.execution import Claim, Finished
from django_intents.worker.queues import LOWEST, by_priority, in_rank, outranks, rank


class EventLoop:
    """A thread running an asyncio loop for one pool's async handlers."""

    def __init__(self, finished: Finished, wake: Callable[[], None], slots: int) -> None:
        self._finished = finished
        self._wake = wake
        self._slots = slots
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ringing = False  # a wake of the pool's loop is scheduled on this loop
        self._stopping = False
        # Claims waiting for a slot, highest priority first: the pool's loop
        # puts and takes, this loop's thread starts them; both under the lock.
        self._waiting: deque[Claim] = deque()
        self._last = LOWEST  # the rank of the claim queued last, the lowest waiting
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="intents-async", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, claims: list[Claim]) -> None:
        """Queue the claims and start what the free slots take; safe from any thread,
        one wake-up for all."""
        if not claims:
            return
        claims = in_rank(claims)
        with self._lock:
            if self._waiting and outranks(claims, self._last):
                self._waiting = deque(by_priority([*self._waiting, *claims]))
            else:
                self._waiting.extend(claims)
            self._last = rank(self._waiting[-1])
        self._loop.call_soon_threadsafe(self._fill)

    def qsize(self) -> int:
        """How many claims wait for a slot."""
        return len(self._waiting)

    def take(self, count: int) -> list[Claim]:
        """Up to ``count`` waiting claims, the last queued first, to give back unstarted."""
        with self._lock:
            count = min(count, len(self._waiting))
            return [self._waiting.pop() for _ in range(count)]

    def stop(self, timeout: float = 1.0) -> None:
        """Cancel what still runs (its claims were released or abandoned) and end the thread."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._cancel_all)
        self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            # As asyncio.run ends: what handlers left open (async generators, the
            # default executor) is closed, not collected with a warning.
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()

    def _cancel_all(self) -> None:
        self._stopping = True  # what still waits was released, or is abandoned
        for task in self._tasks:
            task.cancel()
        if not self._tasks:
            self._loop.stop()
            return
        done = asyncio.gather(*self._tasks, return_exceptions=True)
        done.add_done_callback(lambda _: self._loop.stop())

    def _fill(self) -> None:
        """Start waiting claims while a slot is free."""
        while len(self._tasks) < self._slots and not self._stopping:
            with self._lock:
                if not self._waiting:
                    return
                claim = self._waiting.popleft()
            self._start(claim)

    def _start(self, claim: Claim) -> None:
        if not claim.startable():
            self._hand_back(claim)
            return
        task = self._loop.create_task(self._attempt(claim), name=claim.name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        loop = self._loop

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the task is over
                loop.call_soon_threadsafe(task.cancel)

        claim.attempt.when_lost(cancel)

    async def _attempt(self, claim: Claim) -> None:
        claim.started = started = time.monotonic()
        error: BaseException | None = None
        # No deadline without a timeout; with one, the task is cancelled when it passes.
        window = asyncio.timeout(claim.timeout)
        with processing(claim):
            try:
                handler = cast(Callable[..., Coroutine[Any, Any, object]], claim.handler)
                async with window:
                    await handler(claim.intent, claim.attempt)
            except asyncio.CancelledError as exc:
                # The claim was lost, or the pool released it past the grace period.
                error = exc
            except BaseException as exc:  # a handler's failure is a result, never a dead loop
                error = exc
            if window.expired():
                # Cancelled at its timeout: a failure, whether the handler then
                # raised TimeoutError, something else, or swallowed the cancellation.
                claim.timed_out(started)
            else:
                claim.ended(started, error)
        error = None  # a traceback-frame cycle, as in execution.Executor.run
        self._hand_back(claim)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._fill()

    def _hand_back(self, claim: Claim) -> None:
        """Queue the outcome; wake the pool's loop once for all handed back in this pass."""
        self._finished.put(claim)
        if not self._ringing:
            self._ringing = True
            self._loop.call_soon(self._ring)

    def _ring(self) -> None:
        self._ringing = False
        self._wake()
