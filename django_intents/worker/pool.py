"""The worker pool behind ``manage.py run_intent_workers``: its loop.

One thread runs the loop: record the results handed back, renew the leases
of the claims held, claim due intents for the idle worker threads and the
free slots of the event loop, then sleep until something may have changed.
Sync handlers run in worker threads, async ones on the pool's event loop
(``execution.py``, ``eventloop.py``); both only hand their outcome back, and
the loop records every result with fenced batch transitions on its own
connection (``recorder.py``), so a result that arrives after its claim was
taken over changes nothing, and the pool's connections do not grow with its
concurrency. The guarantee is at least once: a worker that dies leaves a
claim that another worker takes when its lease expires.

The loop is built from parts that each own their state and are called only
from the loop thread: how much to claim (``demand.py``), the claims held
and their timeouts (``leases.py``), the results to record (``recorder.py``), the stop
(``shutdown.py``), the end of a drain (``drain.py``), the outage rule
(``outage.py``) and the housekeeping, schedules included
(``housekeeping.py``). The threads around it never share a field with it:
they take claims from the queues (``queues.py``) and hand them back through
the ``finished`` queue, the listener and the threads ring the alarm, and
``stop()`` hands its deadline over through a queue of its own.
"""

from __future__ import annotations

import math
import queue
import random
import time
from collections.abc import Mapping
from datetime import datetime

from django.db import Error as DatabaseFailure
from django.db import connections, router

from django_intents.attempt import Attempt
from django_intents.conf import get_settings
from django_intents.handlers import Handler
from django_intents.models import Intent
from django_intents.rules.limits import limited_kinds, paced_kinds
from django_intents.rules.validation import check_pool
from django_intents.signals import Outcome
from django_intents.store import backend_for
from django_intents.store.clock import server_now
from django_intents.store.memory import ClaimMemory
from django_intents.worker import log
from django_intents.worker.demand import ClaimGroup, claim_groups
from django_intents.worker.drain import Drain
from django_intents.worker.eventloop import EventLoop
from django_intents.worker.execution import (
    Claim,
    Executor,
    Finished,
    is_async,
    needs_event_loop,
    resolve,
)
from django_intents.worker.housekeeping import Housekeeping, Liveness
from django_intents.worker.leases import LeaseTable
from django_intents.worker.outage import Outage, cause_text, reuse_connection
from django_intents.worker.queues import LocalQueue, Queued
from django_intents.worker.recorder import Recorder
from django_intents.worker.shutdown import Shutdown
from django_intents.worker.startup import log_start
from django_intents.worker.tally import Tally
from django_intents.worker.wakeup import Alarm, Waker, start_waker


class WorkerPool:
    """Claim due intents of the given kinds and run their handlers: sync ones in threads,
    async ones on an event loop.

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
        concurrency: int | None = None,
        lease: float | None = None,
        renew: float | None = None,
        grace: float = 10.0,
        drain: bool = False,
        until_empty: bool = False,
        timeout: float | None = None,
        timeout_per_attempt: float | None = None,
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
        self._concurrency = settings.concurrency if concurrency is None else concurrency
        self._lease = settings.lease if lease is None else lease
        if renew is None:
            renew = settings.renew_interval if lease is None else self._lease / 3
        self._renew = renew
        self._grace = grace
        # Seconds an attempt of each kind may run: its LIMITS entry, else the pool's default.
        default = None if timeout_per_attempt is None else float(timeout_per_attempt)
        self._timeouts = {kind: settings.timeouts.get(kind, default) for kind in self._handlers}
        self._poll = settings.poll_interval if poll_interval is None else poll_interval
        limited = limited_kinds(settings.limits, settings.targets)
        self._groups = claim_groups(
            self._handlers,
            self._workers,
            self._concurrency,
            self._lease,
            limited,
            paced=paced_kinds(settings.targets),
        )
        if db_error_timeout is None:
            db_error_timeout = settings.db_error_timeout
        self._using = using or router.db_for_write(Intent)
        self._handle_signals = handle_signals
        check_pool(self._handlers, self._workers, self._concurrency, lease=self._lease, renew=renew)
        self._drain = Drain(
            using=self._using, kinds=self._kinds, due=drain, empty=until_empty, timeout=timeout
        )

        self._manager = Intent.objects.db_manager(self._using)
        # What the pool's claims learn from each other, and the listener's hints.
        self._memory = ClaimMemory()
        self._alarm = Alarm()
        self._jobs = LocalQueue()
        self._finished: Finished = queue.SimpleQueue()
        self._executor = Executor(using=self._using)
        loop = needs_event_loop(self._handlers.values())
        self._eventloop = (
            EventLoop(self._finished, self._alarm.ring, self._concurrency) if loop else None
        )
        self._liveness = Liveness(self._poll)
        self._waker: Waker | None = None  # started by run()
        self._leases = LeaseTable(
            self._manager, lease=self._lease, renew=self._renew, reached=self._liveness.reached
        )
        self._recorder = Recorder(
            self._manager, max_attempts=settings.max_attempts, wake=self._alarm.ring
        )
        self._shutdown = Shutdown(self._manager, grace=grace, alarm=self._alarm)
        # Claims and writes fail apart (the writes may have a thread of their own):
        # a claim that works does not end an outage of the writes.
        self._outage = Outage(
            using=self._using, timeout=db_error_timeout, then="exiting", sleep=self._alarm.sleep
        )
        self._write_outage = Outage(
            using=self._using, timeout=db_error_timeout, then="exiting", sleep=self._alarm.sleep
        )
        self._housekeeping = Housekeeping(
            report_interval=report_interval,
            kinds=self._kinds,
            using=self._using,
            tally=self._recorder.tally,
        )
        self._probe_first: bool | None = None  # known once connected (MySQL asks the server)

    # -- public ----------------------------------------------------------------

    def run(self) -> int:
        """Run the pool; return 0 after a stop or a drain, 1 after an outage or a timeout.

        A drain also returns 1 when a result could not be recorded.
        """
        self._drain.start()
        self._liveness.start()
        self._housekeeping.start()
        count = self._workers if self._groups[0].kinds else 0
        threads = self._executor.start(count, self._jobs, self._finished, self._alarm.ring)
        if self._eventloop is not None:
            self._eventloop.start()
        try:
            self._waker = start_waker(
                using=self._using,
                kinds=self._kinds,
                wake=self._alarm.ring,
                on_priority=self._memory.hint,
            )
            # Handled before the start line: whoever waits for it may stop us at once.
            with self._shutdown.signals_handled(self._handle_signals):
                log_start(
                    using=self._using,
                    handlers=self._handlers,
                    workers=self._workers,
                    concurrency=self._concurrency,
                    lease=self._lease,
                    renew=self._renew,
                    poll=self._poll,
                    grace=self._grace,
                    drain=self._drain.describe(),
                    waker=self._waker,
                )
                status = self._loop()
                if status == 0:
                    self._release_unfinished()
                    status = self._drain.status()
                else:
                    self._abandon()
        finally:
            self._liveness.stop()
            if self._waker is not None:
                self._waker.stop()
            until = time.monotonic() + 1.0
            self._executor.stop(threads, self._jobs, until)
            if self._eventloop is not None:
                self._eventloop.stop(max(until - time.monotonic(), 0.1))
            self._recorder.stop()
            self._housekeeping.stop()
            connections.close_all()
            self._alarm.close()
        self._housekeeping.stopped()
        return status

    def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming, ask running attempts to stop and exit after at most ``grace`` seconds.

        Safe to call from any thread or a signal handler: it only hands the
        deadline to the loop, which does the rest. A second call can only
        shorten the grace period.
        """
        self._shutdown.request(grace)

    @property
    def outcomes(self) -> Tally:
        """What the pool's attempts came to, per kind: read once ``run`` has returned."""
        return self._recorder.tally

    def healthy(self) -> bool:
        """True while the loop runs and recently completed a database round trip."""
        return self._liveness.healthy()

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> int:
        # Pools started together (a deploy, a restart) should not claim in step.
        self._alarm.sleep(random.uniform(0, self._poll))  # noqa: S311 - jitter
        while True:
            turn = time.monotonic()
            self._collect()
            if self._recorder:
                try:
                    self._record()
                except DatabaseFailure as exc:
                    if self._write_outage.failed(exc):
                        return 1
                    continue
            if self._drain.overdue():
                self._shutdown.request()
            deadline = self._shutdown.deadline()
            if deadline is not None:
                self._shutdown.begin([jobs for _, jobs in self._queued()], self._leases)
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
                reuse_connection(
                    self._using, prepare=bool(self._waker and self._waker.direct.is_set())
                )
                self._leases.refused(self._leases.renew_due())
                if deadline is None:
                    for group, jobs in self._queued():
                        group.demand.give_back_stalled(jobs, self._leases, self._shutdown)
                    drained = self._drain.done(self._claim(), len(self._leases))
                    for group in self._groups:
                        group.demand.turned(time.monotonic() - turn)
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
        """Claim as many intents as the pool has room for, per group (``ClaimGroup``).

        Returns how many were claimed; 0 when every claim found nothing;
        ``None`` when a group had no room or a claim above the floor
        (``ClaimFloor``) found nothing, which does not prove that nothing is due.
        """
        counts = [self._claim_group(group) for group in self._groups if group.kinds]
        if any(counts):
            return sum(n or 0 for n in counts)
        return None if None in counts else 0

    def _claim_group(self, group: ClaimGroup) -> int | None:
        if group.reopens <= time.monotonic():
            group.reopens = math.inf  # this turn is the wake it asked for
        free = self._room(group)
        if free <= 0:
            return None
        sent = time.monotonic()
        if self._probe_first is None:
            backend = backend_for(connections[self._using], Intent)
            self._probe_first = not backend.claims_skip_locked
            # The same capability says whether a second writer can work meanwhile.
            self._recorder.threaded = not self._probe_first
        floor = group.floor
        since, now = floor.since(), server_now(self._manager.db)
        if self._probe_first:
            # SQLite claims under its one write lock; an idle pool polling ten
            # times a second would take it from the application every time.
            due = self._manager.has_due(
                now=now, kinds=group.kinds, since=since, memory=self._memory
            )
            self._liveness.reached()
            if not due:
                floor.seen(since, now, None, took=time.monotonic() - sent)
                return self._drained_below(since)
        paced = None
        if group.paced:
            waiting = sum(1 for c in self._leases.claims() if c.paced and c.started is None)
            paced = group.demand.paced(self._leases.busy(group.awaited), waiting)
        intents, completed = self._recorder.claiming(
            lambda done: self._manager.claim_many(
                free,
                now=now,
                lease=self._lease,
                kinds=group.kinds,
                since=since,
                complete=done,
                memory=self._memory,
                paced=paced,
            ),
            ride=group.limited,
        )
        self._settle(completed)
        self._liveness.reached()
        floor.claimed(since, now, intents, free, took=time.monotonic() - sent)
        group.demand.claimed(intents.bound)
        group.reopens = reopening(intents.next_start, now)
        if not intents:
            return self._drained_below(since)
        claims = [
            Claim(
                intent=intent,
                attempt=Attempt(intent, using=self._using),
                handler=resolve(self._handlers[intent.kind], intent),
                awaited=group.awaited,
                timeout=self._timeouts[intent.kind],
                paced=intent.kind in group.paced,
            )
            for intent in intents
        ]
        if self._shutdown.deadline() is not None:
            # A stop arrived while the claim was in flight: hand them back unstarted.
            self._shutdown.release(claims, started=False)
            return 0
        awaited: list[Claim] = []
        queued: list[Claim] = []
        for claim in claims:
            self._leases.add(claim, sent=sent)
            loop = self._eventloop is not None and is_async(claim.handler)
            (awaited if loop else queued).append(claim)
        self._jobs.put_claims(queued)
        if awaited and self._eventloop is not None:
            self._eventloop.submit(awaited)
        return len(claims)

    def _room(self, group: ClaimGroup) -> int:
        """How many more claims the group's threads or event loop can start now."""
        return group.demand.capacity() - self._leases.busy(group.awaited)

    def _queued(self) -> list[tuple[ClaimGroup, Queued]]:
        """Each group's claims waiting to start: in the threads' queue, on the event loop."""
        waiting: list[Queued] = (
            [self._jobs] if self._eventloop is None else [self._jobs, self._eventloop]
        )
        return list(zip(self._groups, waiting, strict=False))

    def _drained_below(self, since: datetime | None) -> int | None:
        floors = [group.floor for group in self._groups]
        return self._drain.found_nothing(since, floors, self._alarm.ring)

    def _collect(self) -> None:
        """Take the claims whose handlers have returned, or were given up on past their
        timeout; queue their results to record."""
        for given_up in self._leases.time_out(self._grace):
            self._finished.put(given_up)
        while True:
            try:
                claim = self._finished.get_nowait()
            except queue.Empty:
                return
            if not self._leases.returned(claim):
                continue  # returned after it was given up on: its timeout is its result
            self._groups[claim.awaited].demand.learn(claim.duration)
            outcome = self._recorder.add(claim)
            if outcome is not None:  # nothing to record: it was lost, or atomic() completed it
                self._leases.drop(claim)

    def _record(self, *, wait: float | None = None) -> None:
        """Record the results handed back (``recorder.py``); with ``wait``, all of them."""
        recorder = self._recorder
        self._settle(recorder.record() if wait is None else recorder.finish(wait))
        self._liveness.reached()
        blocked = recorder.newly_blocked()
        if blocked:
            self._memory.held()  # the pace a hold teaches binds from its end: read it soon
        if blocked and self._shutdown.deadline() is None:
            self._give_back_blocked(blocked)

    def _give_back_blocked(self, blocked: set[tuple[str, str]]) -> None:
        """Give back unstarted the queued claims of targets a result just held or opened
        (SPEC §14): a partner that said 429 is not sent the requests queued behind it.
        Attempts already running finish normally."""
        for group, jobs in self._queued():
            waiting = jobs.take(jobs.qsize())
            if group.awaited:  # the event loop hands back the last queued first
                waiting.reverse()
            back = [c for c in waiting if (c.intent.kind, c.intent.target) in blocked]
            self._requeue(group, [c for c in waiting if c not in back])
            for claim in back:
                self._leases.drop(claim)
            self._shutdown.release(back, started=False)

    def _requeue(self, group: ClaimGroup, claims: list[Claim]) -> None:
        if group.awaited and self._eventloop is not None:
            self._eventloop.submit(claims)
        else:
            self._jobs.put_claims(claims)

    def _settle(self, outcomes: list[tuple[Claim, Outcome]]) -> None:
        """Let go of the claims whose results are recorded."""
        if outcomes:
            self._write_outage.over()
        for claim, _ in outcomes:
            self._leases.drop(claim)

    def _sleep_time(self) -> float:
        now = time.monotonic()
        wake = [
            self._housekeeping.wake_at(),
            self._liveness.wake_at(),
            self._leases.next_renewal(),
            self._leases.next_timeout(),
            self._drain.wake_at(),
            *(group.demand.wake_at(jobs.qsize()) for group, jobs in self._queued()),
            *(group.reopens for group in self._groups),
        ]
        deadline = self._shutdown.deadline()
        if deadline is not None:
            wake.append(deadline)
        elif any(self._room(group) > 0 for group in self._groups if group.kinds):
            wake.append(now + self._poll * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        return max(min(wake) - now, 0.0)

    def _abandon(self) -> None:
        """After an outage: nothing can be recorded or released; say what is left behind."""
        self._collect()
        self._leases.abandon(unrecorded=len(self._recorder))

    def _release_unfinished(self) -> None:
        """After a stop: release what still runs, then record every result handed back."""
        self._collect()
        self._shutdown.release_unfinished(self._leases, self._collect)
        if self._recorder:
            try:
                self._record(wait=self._outage.timeout)
            except DatabaseFailure as exc:
                log.warning(
                    "%d result(s) not recorded (%s); they run again once their leases expire",
                    len(self._recorder),
                    cause_text(exc),
                )
                self._drain.unrecorded(len(self._recorder))


# After the time a rate's window reopens, so that the claim finds it open
# though the database's clock and this host's disagree by a little.
REOPEN_MARGIN = 0.002  # seconds


def reopening(next_start: datetime | None, now: datetime) -> float:
    """``next_start`` (a claim's ``Claims.next_start``, on the database's clock
    like ``now``) on the monotonic clock; never, when there is none."""
    if next_start is None:
        return math.inf
    return time.monotonic() + max((next_start - now).total_seconds(), 0.0) + REOPEN_MARGIN
