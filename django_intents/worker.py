"""The worker pool behind ``manage.py run_intent_workers``: its loop.

One thread runs the loop: record the successes handed back, renew the leases
of the claims held, claim due intents for the idle worker threads, then sleep
until something may have changed. Worker threads run the handlers and record
any other result with a fenced transition (``execution.py``), so a result
that arrives after its claim was taken over changes nothing. The guarantee is
at least once: a worker that dies leaves a claim that another worker takes
when its lease expires.

The loop is built from parts that each own their state and are called only
from the loop thread: how much to claim (``demand.py``), the claims held
(``leases.py``), the batched successes (``completer.py``), the stop
(``shutdown.py``), the end of a drain (``drain.py``), the outage rule
(``outage.py``) and the housekeeping (``housekeeping.py``). The threads
around it never share a field with it: worker threads hand claims back
through the ``finished`` queue (its messages are explained in
``execution.py``), the listener and the threads ring the alarm, and
``stop()`` hands its deadline over through a queue of its own.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Mapping
from datetime import datetime

from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections, router
from django.utils import timezone

from .attempt import Attempt
from .completer import Completer
from .conf import get_settings
from .demand import Demand
from .drain import Drain
from .execution import Claim, Executor, Finished, Jobs, Progress
from .floor import ClaimFloor
from .handlers import Handler
from .housekeeping import Housekeeping, Liveness
from .leases import LeaseTable
from .models import Intent
from .outage import Outage, cause_text
from .shutdown import Shutdown
from .startup import log_start
from .wakeup import Alarm, start_waker

log = logging.getLogger(__name__)


class WorkerPool:
    """Claim due intents of the given kinds and run their handlers in threads.

    ``run()`` blocks until ``stop()`` is called (or SIGTERM/SIGINT arrives, when
    run in the main thread), with ``drain`` until nothing is due, or with
    ``until_empty`` until nothing is pending or running (``drain.py``; both
    bounded by ``timeout``), and returns the process exit status. A pool runs
    once.
    """

    def __init__(
        self,
        *,
        handlers: Mapping[str, Handler],
        workers: int | None = None,
        lease: float | None = None,
        renew: float | None = None,
        grace: float = 10.0,
        drain: bool = False,
        until_empty: bool = False,
        timeout: float | None = None,
        poll_interval: float | None = None,
        db_error_timeout: float | None = None,
        report_interval: float = 60.0,
        using: str | None = None,
        handle_signals: bool = True,
    ) -> None:
        settings = get_settings()
        self._handlers = dict(handlers)
        self._kinds = sorted(self._handlers)
        self._workers = settings.workers if workers is None else workers
        self._lease = settings.lease if lease is None else lease
        if renew is None:
            renew = settings.renew_interval if lease is None else self._lease / 3
        self._renew = renew
        self._grace = grace
        self._poll = settings.poll_interval if poll_interval is None else poll_interval
        if db_error_timeout is None:
            db_error_timeout = settings.db_error_timeout
        self._using = using or router.db_for_write(Intent)
        self._handle_signals = handle_signals
        if not self._handlers:
            raise ValueError("a worker pool needs at least one handler")
        if self._workers < 1:
            raise ValueError(f"workers must be at least 1, not {self._workers}")
        if not 0 < self._renew < self._lease:
            raise ValueError(
                f"renew ({self._renew} s) must be shorter than lease ({self._lease} s)"
            )
        self._drain = Drain(
            using=self._using, kinds=self._kinds, due=drain, empty=until_empty, timeout=timeout
        )

        self._manager = Intent.objects.db_manager(self._using)
        self._alarm = Alarm()
        self._jobs: Jobs = queue.SimpleQueue()
        self._finished: Finished = queue.SimpleQueue()
        self._executor = Executor(
            self._manager,
            using=self._using,
            max_attempts=settings.max_attempts,
            db_error_timeout=db_error_timeout,
        )
        self._liveness = Liveness(self._poll)
        self._leases = LeaseTable(
            self._manager, lease=self._lease, renew=self._renew, reached=self._liveness.reached
        )
        self._completer = Completer(self._manager)
        self._shutdown = Shutdown(self._manager, grace=grace, alarm=self._alarm)
        self._outage = Outage(
            using=self._using, timeout=db_error_timeout, then="exiting", sleep=self._alarm.sleep
        )
        self._housekeeping = Housekeeping(
            report_interval=report_interval, retention=settings.retention is not None
        )
        self._demand = Demand(self._workers)
        self._floor = ClaimFloor()
        self._probe_first: bool | None = None  # known once connected (MySQL asks the server)

    # -- public ----------------------------------------------------------------

    def run(self) -> int:
        """Run the pool; return 0 after a stop or a drain, 1 after an outage or a timeout.

        A drain also returns 1 when a result could not be recorded.
        """
        self._drain.start()
        self._liveness.start()
        self._housekeeping.start()
        threads = [
            threading.Thread(
                target=self._executor.serve,
                args=(self._jobs, self._finished, self._alarm.ring),
                name=f"intents-worker-{n}",
                daemon=True,
            )
            for n in range(1, self._workers + 1)
        ]
        for thread in threads:
            thread.start()
        listener = None
        try:
            listener = start_waker(using=self._using, kinds=self._kinds, wake=self._alarm.ring)
            log_start(
                using=self._using,
                handlers=self._handlers,
                workers=self._workers,
                lease=self._lease,
                renew=self._renew,
                poll=self._poll,
                grace=self._grace,
                drain=self._drain.describe(),
                waker=listener,
            )
            with self._shutdown.signals_handled(self._handle_signals):
                status = self._loop()
                if status == 0:
                    self._release_unfinished()
                    status = self._drain.status()
                else:
                    self._leases.abandon()
        finally:
            self._liveness.stop()
            if listener is not None:
                listener.stop()
            for _ in threads:
                self._jobs.put(None)
            # Idle threads exit at once and close their connections; a thread
            # stuck in a handler is a daemon and ends with the process.
            until = time.monotonic() + 1.0
            for thread in threads:
                thread.join(max(until - time.monotonic(), 0.0))
            connections.close_all()
            self._alarm.close()
        log.info("stopped")
        return status

    def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming, ask running attempts to stop and exit after at most ``grace`` seconds.

        Safe to call from any thread or a signal handler: it only hands the
        deadline to the loop, which does the rest. A second call can only
        shorten the grace period.
        """
        self._shutdown.request(grace)

    def healthy(self) -> bool:
        """True while the loop runs and recently completed a database round trip."""
        return self._liveness.healthy()

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> int:
        # Pools started together (a deploy, a restart) should not claim in step.
        self._alarm.sleep(random.uniform(0, self._poll))  # noqa: S311 - jitter
        while True:
            self._collect()
            if self._completer:
                try:
                    self._complete()
                except DatabaseFailure as exc:
                    if self._outage.failed(exc):
                        return 1
                    continue
            if self._drain.overdue():
                self._shutdown.request()
            deadline = self._shutdown.deadline()
            if deadline is not None:
                self._shutdown.begin(self._jobs, self._leases)
                if not self._leases:
                    return 0
                if time.monotonic() >= deadline:
                    log.info(
                        "grace period over with %d handler(s) still running; releasing them",
                        len(self._leases),
                    )
                    return 0
            drained = False
            try:
                close_old_connections()
                self._renew_leases()
                if deadline is None:
                    drained = self._drain.done(self._claim(), len(self._leases))
                self._liveness.keep_alive(connections[self._using])
            except DatabaseFailure as exc:
                if self._outage.failed(exc):
                    return 1
                continue
            self._outage.over()
            self._housekeeping.run_due(running=len(self._leases))
            if drained:
                return 0
            self._alarm.sleep(self._sleep_time())

    def _claim(self) -> int | None:
        """Claim as many intents as the pool has room for (``demand.py``).

        Returns how many were claimed, or ``None`` when no worker is idle or a
        claim above the floor (``ClaimFloor``) found nothing, which does not
        prove that nothing is due.
        """
        free = self._demand.capacity() - len(self._leases)
        if free <= 0:
            return None
        sent = time.monotonic()
        if self._probe_first is None:
            features = connections[self._using].features
            self._probe_first = not features.has_select_for_update_skip_locked
        since, now = self._floor.since(), timezone.now()
        if self._probe_first:
            # SQLite claims under its one write lock; an idle pool polling ten
            # times a second would take it from the application every time.
            due = self._manager.has_due(now=now, kinds=self._kinds, since=since)
            self._liveness.reached()
            if not due:
                self._floor.seen(since, now, None)
                return self._drained_below(since)
        intents = self._manager.claim_many(
            free, now=now, lease=self._lease, kinds=self._kinds, since=since
        )
        self._liveness.reached()
        self._floor.seen(since, now, intents[0].next_at if intents else None)
        if not intents:
            return self._drained_below(since)
        if self._shutdown.deadline() is not None:
            # A stop arrived while the claim was in flight: hand them back unstarted.
            for intent in intents:
                self._manager.release(intent.id, intent.claim_token)
            return 0
        for intent in intents:
            claim = Claim(
                intent=intent,
                attempt=Attempt(intent, using=self._using),
                handler=self._handlers[intent.kind],
            )
            self._leases.add(claim, sent=sent)
            self._jobs.put(claim)
        return len(intents)

    def _drained_below(self, since: datetime | None) -> int | None:
        """0 when a claim found nothing; ``None`` if only a floored one did.

        A drain may end only when a claim that looked at the whole index found
        nothing, so the next turn of a draining pool makes a full one at once.
        """
        if since is None:
            return 0
        if self._drain.ends_on_claim:
            self._floor.rescan()
            self._alarm.ring()
        return None

    def _renew_leases(self) -> None:
        refused = self._leases.renew_due()
        if refused:
            # A thread says RECORDING before its own transition, which also ends
            # the lease: if that is why a renewal was refused, the message is
            # already in the queue, and the table must hear it before it judges.
            self._collect()
            self._leases.refused(refused)

    def _collect(self) -> None:
        """Read what the worker threads handed back (see ``execution.py``)."""
        while True:
            try:
                claim, message = self._finished.get_nowait()
            except queue.Empty:
                return
            if message is Progress.RECORDING:
                self._leases.finishing(claim)
                continue
            self._demand.learn(claim.duration)
            if message is Progress.COMPLETING:
                self._leases.finishing(claim)
                self._completer.add(claim)
            elif message is Progress.UNRECORDED:
                self._leases.drop(claim)
                self._drain.unrecorded()
            else:
                self._leases.drop(claim)
                self._housekeeping.count(message)

    def _complete(self) -> None:
        """Record the successes handed back so far, in one fenced statement."""
        outcomes = self._completer.complete()
        self._liveness.reached()
        for claim, outcome in outcomes:
            self._leases.drop(claim)
            self._housekeeping.count(outcome)

    def _sleep_time(self) -> float:
        now = time.monotonic()
        wake = [
            self._housekeeping.wake_at(),
            self._liveness.wake_at(),
            self._leases.next_renewal(),
            self._drain.wake_at(),
        ]
        deadline = self._shutdown.deadline()
        if deadline is not None:
            wake.append(deadline)
        elif len(self._leases) < self._demand.capacity():
            wake.append(now + self._poll * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        return max(min(wake) - now, 0.0)

    def _release_unfinished(self) -> None:
        """After a stop: record what finished, then release what still runs."""
        self._collect()
        if self._completer:
            try:
                self._complete()
            except DatabaseFailure as exc:
                log.warning(
                    "%d success(es) not recorded (%s); they run again once their leases expire",
                    len(self._completer),
                    cause_text(exc),
                )
                self._drain.unrecorded(len(self._completer))
        self._shutdown.release_unfinished(self._leases, self._collect)
