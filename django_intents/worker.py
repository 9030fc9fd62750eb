"""The worker pool behind ``manage.py run_intent_workers``.

One thread runs the loop: claim due intents for the idle worker threads,
renew the leases of the claimed ones, then sleep until something may have
changed. Worker threads run the handlers and record each result with a fenced
transition (``execution.py``), so a result that arrives after its claim was
taken over changes nothing. The guarantee is at least once: a worker that dies leaves a
claim that another worker takes when its lease expires.

Only the loop thread touches the table of running claims; worker threads hand
finished claims back through a queue, and signal handlers only set a deadline
and ring the alarm. No lock is shared between them.

Successes are recorded by the loop, not by the worker threads: each time it
wakes it completes every success handed back since, in one fenced statement
(``complete_many``), and then claims as many intents as it has room for: one
per idle worker, or, while handlers are quick, one more per worker queued
behind them (``_capacity``). A
busy pool thus costs the database about two statements per loop turn however
many handlers finished, instead of one commit per intent; failures, which are
rare and need their own backoff and error text, are still recorded one by one
by the worker that saw them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from datetime import datetime
from types import FrameType

from django.db import Error as DatabaseFailure
from django.db import close_old_connections, connections, router
from django.utils import timezone

from .attempt import Attempt
from .conf import get_settings
from .execution import COMPLETING, MAX_RETRY_DELAY, Claim, Executor, cause_text, send_finished
from .floor import ClaimFloor
from .handlers import Handler, describe
from .models import Intent
from .wakeup import Alarm, CommitWatcher, Listener, commit_watch_supported, listen_supported

log = logging.getLogger(__name__)

OUTCOMES = ("success", "error", "stopped", "fenced")
PRUNE_INTERVAL = 60.0
PRUNE_BATCH_SIZE = 100
# While handlers take less than this on average, the pool claims up to twice as
# many intents as it has worker threads, so that threads never wait for the
# loop's round trips; slower handlers get one claim per idle thread.
CLAIM_AHEAD_BELOW = 0.02


class WorkerPool:
    """Claim due intents of the given kinds and run their handlers in threads.

    ``run()`` blocks until ``stop()`` is called (or SIGTERM/SIGINT arrives, when
    run in the main thread), or with ``drain`` until nothing is due, and
    returns the process exit status. A pool runs once.
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
        self._drain = drain
        self._poll = settings.poll_interval if poll_interval is None else poll_interval
        self._db_error_timeout = (
            settings.db_error_timeout if db_error_timeout is None else db_error_timeout
        )
        self._report_interval = report_interval
        self._using = using or router.db_for_write(Intent)
        self._handle_signals = handle_signals
        self._max_attempts = settings.max_attempts
        self._retention = settings.retention is not None
        if not self._handlers:
            raise ValueError("a worker pool needs at least one handler")
        if self._workers < 1:
            raise ValueError(f"workers must be at least 1, not {self._workers}")
        if not 0 < self._renew < self._lease:
            raise ValueError(
                f"renew ({self._renew} s) must be shorter than lease ({self._lease} s)"
            )

        self._manager = Intent.objects.db_manager(self._using)
        self._executor = Executor(
            self._manager,
            using=self._using,
            max_attempts=self._max_attempts,
            db_error_timeout=self._db_error_timeout,
        )
        self._floor = ClaimFloor()
        self._handler_time: float | None = None  # moving average of handler durations, s
        self._probe_first: bool | None = None  # known once connected (MySQL asks the server)
        self._alarm = Alarm()
        self._jobs: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[tuple[Claim, str]] = queue.SimpleQueue()
        self._completing: list[Claim] = []  # successes handed back, not yet recorded
        self._claims: dict[str, Claim] = {}  # by claim token: one intent may be claimed twice
        self._deadline: float | None = None  # set by stop(): end of the grace period
        self._signal = ""
        self._shutting_down = False
        self._alive = False
        self._last_db_ok = time.monotonic()
        self._failing_since: float | None = None
        self._retry_delay = 0.1
        self._outcomes: Counter[str] = Counter()
        self._report_since = self._next_report = self._next_prune = 0.0
        # Liveness: /healthz fails when the loop has not reached the database lately.
        self._health_window = max(10.0, 3 * self._poll)

    # -- public ----------------------------------------------------------------

    def run(self) -> int:
        """Run the pool; return 0 after a stop or a drain, 1 after a database outage."""
        self._alive = True
        self._last_db_ok = self._report_since = time.monotonic()
        self._next_report = self._report_since + self._report_interval
        self._next_prune = self._report_since + random.uniform(0, PRUNE_INTERVAL)  # noqa: S311
        threads = [
            threading.Thread(target=self._work, name=f"intents-worker-{n}", daemon=True)
            for n in range(1, self._workers + 1)
        ]
        for thread in threads:
            thread.start()
        listener = None
        try:
            listener = self._start_listener()
            self._log_start(listener is not None)
            with self._signal_handlers():
                status = self._loop()
                if status == 0:
                    self._release_unfinished()
                else:
                    self._abandon_unfinished()
        finally:
            self._alive = False
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
        """Stop claiming, cancel running attempts and exit after at most ``grace`` seconds.

        Safe to call from any thread or a signal handler: it only sets the
        deadline and wakes the loop, which does the rest. A second call can only
        shorten the grace period.
        """
        deadline = time.monotonic() + (self._grace if grace is None else grace)
        if self._deadline is None or deadline < self._deadline:
            self._deadline = deadline
        self._alarm.ring()

    def healthy(self) -> bool:
        """True while the loop runs and recently completed a database round trip."""
        return self._alive and time.monotonic() - self._last_db_ok <= self._health_window

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> int:
        # Pools started together (a deploy, a restart) should not claim in step.
        self._alarm.sleep(random.uniform(0, self._poll))  # noqa: S311 - jitter
        while True:
            self._collect()
            if self._completing:
                try:
                    self._complete_finished()
                except DatabaseFailure as exc:
                    if self._database_failed(exc):
                        return 1
                    continue
            if self._deadline is not None:
                self._begin_shutdown()
                if not self._claims:
                    return 0
                if time.monotonic() >= self._deadline:
                    log.info(
                        "grace period over with %d handler(s) still running", len(self._claims)
                    )
                    return 0
            claimed = None
            try:
                close_old_connections()
                self._renew_due()
                if self._deadline is None:
                    claimed = self._claim()
                self._keep_alive()
            except DatabaseFailure as exc:
                if self._database_failed(exc):
                    return 1
                continue
            self._database_ok()
            self._housekeeping()
            if self._drain and claimed == 0 and not self._claims:
                log.info("drained: no intent of kinds %s is due", ", ".join(self._kinds))
                return 0
            self._alarm.sleep(self._sleep_time())

    def _claim(self) -> int | None:
        """Claim as many intents as the pool has room for (``_capacity``).

        Returns how many were claimed, or ``None`` when no worker is idle or a
        claim above the floor (``ClaimFloor``) found nothing, which does not
        prove that nothing is due.
        """
        free = self._capacity() - len(self._claims)
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
            self._last_db_ok = time.monotonic()
            if not due:
                self._floor.seen(since, now, None)
                return self._drained_below(since)
        intents = self._manager.claim_many(
            free, now=now, lease=self._lease, kinds=self._kinds, since=since
        )
        self._last_db_ok = time.monotonic()
        self._floor.seen(since, now, intents[0].next_at if intents else None)
        if not intents:
            return self._drained_below(since)
        if self._deadline is not None:
            # A stop arrived while the claim was in flight: hand them back unstarted.
            for intent in intents:
                self._manager.release(intent.id, intent.claim_token)
            return 0
        for intent in intents:
            claim = Claim(
                intent=intent,
                attempt=Attempt(intent, using=self._using),
                handler=self._handlers[intent.kind],
                renew_at=sent + self._renew,
                lease_end=sent + self._lease,
            )
            self._claims[intent.claim_token] = claim
            self._jobs.put(claim)
        return len(intents)

    def _drained_below(self, since: datetime | None) -> int | None:
        """0 when a claim found nothing; ``None`` if only a floored one did.

        A drain may end only when a claim that looked at the whole index found
        nothing, so the next turn of a draining pool makes a full one at once.
        """
        if since is None:
            return 0
        if self._drain:
            self._floor.rescan()
            self._alarm.ring()
        return None

    def _renew_due(self) -> None:
        for claim in list(self._claims.values()):
            now = time.monotonic()
            if now < claim.renew_at:
                continue
            if now >= claim.lease_end:
                # Another worker may hold it by now; the result must not count.
                self._lose(claim, "its lease ran out before it could be renewed")
                continue
            token = claim.intent.claim_token
            renewed = self._manager.renew(claim.intent.id, token, lease=self._lease)
            self._last_db_ok = time.monotonic()
            if renewed:
                claim.renew_at, claim.lease_end = now + self._renew, now + self._lease
            elif claim.finishing:
                claim.renew_at = math.inf  # its thread recorded the result meanwhile
            else:
                self._lose(claim, "it was retried, cancelled or taken over meanwhile")

    def _lose(self, claim: Claim, why: str) -> None:
        claim.attempt._lose()
        claim.renew_at = math.inf
        log.warning("%s: claim lost, %s; attempt cancelled, its result dropped", claim.name, why)

    def _collect(self) -> None:
        while True:
            try:
                claim, outcome = self._finished.get_nowait()
            except queue.Empty:
                return
            last = self._handler_time
            self._handler_time = (
                claim.duration if last is None else 0.8 * last + 0.2 * claim.duration
            )
            if outcome == COMPLETING:
                self._completing.append(claim)
                continue
            self._claims.pop(claim.intent.claim_token, None)
            self._outcomes[outcome] += 1

    def _capacity(self) -> int:
        """How many claims the pool holds at most: running, and queued for a thread.

        Short handlers finish faster than the loop can complete and claim, so
        threads would wait on its two round trips every turn; holding a second
        claim per thread keeps them busy meanwhile (PostgreSQL drain with 4
        workers: about 1.6 times the throughput, docs/benchmarks.md). A queued
        claim's lease is renewed like a running one, and a stop releases it
        unstarted. Slow handlers (or none seen yet) get one claim per thread,
        so an intent never waits in this process behind a long handler while
        another pool is idle.
        """
        quick = self._handler_time is not None and self._handler_time < CLAIM_AHEAD_BELOW
        return self._workers * 2 if quick else self._workers

    def _complete_finished(self) -> None:
        """Record the successes handed back so far, in one fenced statement."""
        batch: list[Claim] = []
        later: list[Claim] = []
        ids: set[str] = set()
        for claim in self._completing:
            # complete_many answers by id: a second claim of one intent waits a turn.
            (later if claim.intent.id in ids else batch).append(claim)
            ids.add(claim.intent.id)
        done = set(
            self._manager.complete_many([(c.intent.id, c.intent.claim_token) for c in batch])
        )
        self._last_db_ok = time.monotonic()
        self._completing = later
        for claim in batch:
            if claim.intent.id in done:
                outcome = "success"
            else:
                log.info("%s: result dropped, the claim was lost", claim.name)
                outcome = "fenced"
            self._claims.pop(claim.intent.claim_token, None)
            self._outcomes[outcome] += 1
            send_finished(claim, outcome)

    def _keep_alive(self) -> None:
        """Touch the database when nothing else did lately, so ``healthy()`` means it."""
        if time.monotonic() - self._last_db_ok < self._health_window / 2:
            return
        with connections[self._using].cursor() as cursor:
            cursor.execute("SELECT 1")
        self._last_db_ok = time.monotonic()

    def _sleep_time(self) -> float:
        now = time.monotonic()
        wake = [self._next_report, self._last_db_ok + self._health_window / 2]
        if self._retention:
            wake.append(self._next_prune)
        wake.extend(claim.renew_at for claim in self._claims.values())
        if self._deadline is not None:
            wake.append(self._deadline)
        elif len(self._claims) < self._capacity():
            wake.append(now + self._poll * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        return max(min(wake) - now, 0.0)

    # -- database errors -------------------------------------------------------

    def _database_failed(self, exc: Exception) -> bool:
        """Log, reconnect and back off; return True once the outage lasted too long."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since, self._retry_delay = now, 0.1
        with contextlib.suppress(DatabaseFailure):
            connections[self._using].close()
        elapsed = now - self._failing_since
        if elapsed >= self._db_error_timeout:
            log.error(
                "database unavailable for %.1f s (limit %.1f s), exiting: %s",
                elapsed,
                self._db_error_timeout,
                cause_text(exc),
            )
            return True
        delay = min(self._retry_delay, max(self._db_error_timeout - elapsed, 0.05))
        log.warning("database error, reconnecting in %.1f s: %s", delay, cause_text(exc))
        self._alarm.sleep(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        self._retry_delay = min(self._retry_delay * 2, MAX_RETRY_DELAY)
        return False

    def _database_ok(self) -> None:
        if self._failing_since is not None:
            elapsed = time.monotonic() - self._failing_since
            log.info("database reachable again after %.1f s", elapsed)
            self._failing_since = None

    # -- shutdown --------------------------------------------------------------

    def _begin_shutdown(self) -> None:
        if self._shutting_down:
            return
        self._shutting_down = True
        self._release_queued()
        for claim in self._claims.values():
            claim.attempt.cancelled.set()
        deadline = self._deadline if self._deadline is not None else time.monotonic()
        log.info(
            "stopping%s: no new claims; %d running attempt(s) cancelled, waiting up to %.1f s",
            f" on {self._signal}" if self._signal else "",
            len(self._claims),
            max(deadline - time.monotonic(), 0.0),
        )

    def _release_queued(self) -> None:
        """Give back the claims no thread has started: pending again, due now, never run."""
        while True:
            try:
                claim = self._jobs.get_nowait()
            except queue.Empty:
                return
            if claim is None:  # stop sentinels are only queued once the loop has ended
                return
            self._claims.pop(claim.intent.claim_token, None)
            claim.attempt._lose()
            try:
                self._manager.release(claim.intent.id, claim.intent.claim_token)
            except DatabaseFailure as exc:
                log.warning(
                    "%s: not started and not released (%s); it runs once its lease expires",
                    claim.name,
                    cause_text(exc),
                )
            else:
                log.info("%s: not started; released, due now", claim.name)

    def _release_unfinished(self) -> None:
        """Give back every claim whose handler is still running: pending, due now."""
        self._collect()
        if self._completing:
            try:
                self._complete_finished()
            except DatabaseFailure as exc:
                log.warning(
                    "%d success(es) not recorded (%s); they run again once their leases expire",
                    len(self._completing),
                    cause_text(exc),
                )
        for claim in list(self._claims.values()):
            if claim.finishing:
                continue  # its thread is recording the result right now
            claim.attempt._lose()  # whatever the handler returns later is dropped
            try:
                released = self._manager.release(claim.intent.id, claim.intent.claim_token)
            except DatabaseFailure as exc:
                log.warning(
                    "%s: not released (%s); it runs again once its lease expires",
                    claim.name,
                    cause_text(exc),
                )
                continue
            if released:
                log.info("%s: handler still running; released, due now", claim.name)

    def _abandon_unfinished(self) -> None:
        for claim in self._claims.values():
            claim.attempt._lose()

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
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
        self._signal = signal.Signals(signum).name
        self.stop(grace=0.0 if self._deadline is not None else None)

    # -- worker threads --------------------------------------------------------

    def _work(self) -> None:
        try:
            while (claim := self._jobs.get()) is not None:
                try:
                    outcome = self._executor.run(claim)
                except Exception:  # a bug here must not cost the pool a worker for good
                    log.exception("%s: internal error in the worker", claim.name)
                    outcome = "error"
                self._finished.put((claim, outcome))
                self._alarm.ring()
        finally:
            connections.close_all()

    # -- start-up and housekeeping ---------------------------------------------

    def _start_listener(self) -> Listener | CommitWatcher | None:
        connection = connections[self._using]
        if commit_watch_supported(connection):
            watcher = CommitWatcher(using=self._using, wake=self._alarm.ring)
            watcher.start()
            return watcher
        if not listen_supported(connection):
            if connection.vendor == "postgresql":
                log.warning("LISTEN/NOTIFY needs psycopg >= 3.2; polling only")
            return None
        listener = Listener(using=self._using, kinds=self._kinds, wake=self._alarm.ring)
        listener.start()
        return listener

    def _log_start(self, listening: bool) -> None:
        connection = connections[self._using]
        kinds = ", ".join(f"{kind} -> {describe(self._handlers[kind])}" for kind in self._kinds)
        wakeups = ""
        if listening:
            wakeups = "commit watch, " if connection.vendor == "sqlite" else "LISTEN/NOTIFY, "
        log.info(
            "starting %d worker(s) on %s database %r (alias %r); kinds: %s; lease %g s, "
            "renewed every %g s; wake-ups: %spolling every %g s; shutdown grace %g s%s",
            self._workers,
            connection.vendor,
            str(connection.settings_dict.get("NAME", "")),
            self._using,
            kinds,
            self._lease,
            self._renew,
            wakeups,
            self._poll,
            self._grace,
            "; draining" if self._drain else "",
        )

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._next_report:
            elapsed = max(now - self._report_since, 1e-9)
            total = sum(self._outcomes.values())
            log.info(
                "%d attempt(s) finished in the last %.0f s (%.2f/s): %s; %d running",
                total,
                elapsed,
                total / elapsed,
                ", ".join(f"{self._outcomes[name]} {name}" for name in OUTCOMES),
                len(self._claims),
            )
            self._outcomes.clear()
            self._report_since, self._next_report = now, now + self._report_interval
        if self._retention and now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL
            self._prune()

    def _prune(self) -> None:
        """Apply ``INTENTS["RETENTION"]`` a little at a time: one small batch a minute."""
        try:
            from .retention import prune
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.retention":
                raise
            log.warning("INTENTS['RETENTION'] is set but this version cannot prune; ignored")
            self._retention = False
            return
        try:
            prune(batch_size=PRUNE_BATCH_SIZE, max_batches=1)
        except Exception as exc:  # housekeeping must never stop the pool
            log.warning("retention pruning failed: %s", cause_text(exc))
