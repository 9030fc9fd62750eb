"""What a pool does besides its work: prove it is alive, say how it goes, prune.

``Liveness`` backs ``/healthz``: a pool is healthy while its loop runs and has
reached the database lately, so a loop stuck in an outage or a hung query
turns the probe red. An idle pool touches the database on purpose now and
then, so that being quiet is not mistaken for being stuck. The loop writes
two values here; the metrics server's thread only reads them.

``Housekeeping`` logs a one-line summary of the pool's outcomes once per
report interval (``--summary-interval``, 60 s by default) and when the pool
stops, from what its recorder counted (``tally.py``), applies
``INTENTS["RETENTION"]`` a little at a time (one small batch a minute, at a
jittered offset so that pools started together do not prune together), and
enqueues the due slots of the schedules whose kind the pool runs, once a
second (``ScheduleTick``), deletes the rows of holds that are over
(``TargetState``, SPEC §14), so that the table keeps a row per target that
is not plainly healthy and no more, and on PostgreSQL moves finished intents
out of the live partition every second.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterable

from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.conf import get_settings
from django_intents.maintenance import retention
from django_intents.maintenance.retention import MOVE_BATCH
from django_intents.maintenance.schedules import enqueue_due, schedules
from django_intents.models import Intent
from django_intents.observability import rollup
from django_intents.worker import log
from django_intents.worker.outage import cause_text
from django_intents.worker.tally import COLUMNS, Tally

PRUNE_INTERVAL = 60.0
PRUNE_BATCH_SIZE = 100
SCHEDULE_INTERVAL = 1.0  # SPEC §11: a pool enqueues its due slots at least once a second
SWEEP_INTERVAL = 10.0  # seconds between a pool's sweeps of the holds that are over
# Seconds between a pool's moves of finished intents out of PostgreSQL's live
# partition (maintenance/retention.move_finished); at once again after a full batch.
MOVE_INTERVAL = 1.0


class Liveness:
    """When the loop last completed a database round trip."""

    def __init__(self, poll_interval: float) -> None:
        self.window = max(10.0, 3 * poll_interval)  # /healthz fails after this long unreached
        self._alive = False
        self._reached_at = 0.0

    def start(self) -> None:
        self._alive = True
        self._reached_at = time.monotonic()

    def stop(self) -> None:
        self._alive = False

    def reached(self) -> None:
        self._reached_at = time.monotonic()

    def healthy(self) -> bool:
        return self._alive and time.monotonic() - self._reached_at <= self.window

    def keep_alive(self, connection: BaseDatabaseWrapper) -> None:
        """Touch the database when nothing else did lately, so ``healthy()`` means it."""
        if time.monotonic() < self.wake_at():
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        self.reached()

    def wake_at(self) -> float:
        return self._reached_at + self.window / 2


class ScheduleTick:
    """``enqueue_due`` for the pool's kinds once a second, on the pool's connection.

    A pool without schedules of its kinds never queries: the tick then never
    wakes the loop either. A failure is logged once, until a tick works again;
    the slot is enqueued by the next tick that works, while it is still due,
    or by catch-up after that.
    """

    def __init__(self, kinds: Iterable[str], using: str) -> None:
        self._kinds = list(kinds)
        self._using = using
        self._next = 0.0
        self._failing = False

    def wake_at(self) -> float:
        return self._next if schedules(self._kinds) else math.inf

    def run_due(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + SCHEDULE_INTERVAL
        try:
            enqueue_due(kinds=self._kinds, using=self._using)
        except Exception as exc:  # housekeeping must never stop the pool
            if not self._failing:
                log.warning("enqueuing due schedule slots failed: %s", cause_text(exc))
            self._failing = True
        else:
            if self._failing:
                log.info("enqueuing due schedule slots works again")
            self._failing = False


class Housekeeping:
    """The summaries, retention pruning and schedules, each on its own clock."""

    def __init__(
        self, *, report_interval: float, kinds: Iterable[str], using: str, tally: Tally
    ) -> None:
        if not 0 < report_interval < math.inf:
            raise ValueError(f"report_interval must be a positive number, not {report_interval!r}")
        self._report_interval = report_interval
        self._using = using
        self._retention = get_settings().retention is not None
        self._schedules = ScheduleTick(kinds, using)
        self._tally = tally
        self._reported: Counter[str] = Counter()  # the tally's totals at the last report
        self._since = self._next_report = self._next_prune = self._next_rollup = 0.0
        self._next_sweep = self._next_move = 0.0
        self._moving_failed = False

    def start(self) -> None:
        self._since = time.monotonic()
        self._tally.start()
        self._next_report = self._since + self._report_interval
        self._next_prune = self._since + random.uniform(0, PRUNE_INTERVAL)  # noqa: S311
        # Before the first claim, so a due slot is claimable from the first turn
        # (a --drain pool runs the slot that was due when it started).
        self._schedules.run_due(self._since)

    def wake_at(self) -> float:
        prune = self._next_prune if self._retention else math.inf
        return min(self._next_report, prune, self._schedules.wake_at())

    def run_due(self, *, running: int) -> None:
        now = time.monotonic()
        if now >= self._next_report:
            self._report(now, running)
        if self._retention and now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL
            try:
                retention.prune(batch_size=PRUNE_BATCH_SIZE, max_batches=1, using=self._using)
            except Exception as exc:  # housekeeping must never stop the pool
                log.warning("retention pruning failed: %s", cause_text(exc))
        self._schedules.run_due(now)
        if now >= self._next_move:
            self._move_finished(now)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL
            try:
                Intent.objects.db_manager(self._using).end_holds()
            except Exception as exc:  # housekeeping must never stop the pool
                log.warning("sweeping the targets' ended holds failed: %s", cause_text(exc))
        if now >= self._next_rollup:  # the dashboard's counts (observability/rollup.py)
            self._next_rollup = now + rollup.FLUSH_INTERVAL
            rollup.flush(using=self._using)

    def _move_finished(self, now: float) -> None:
        """Finished intents out of the live partition (PostgreSQL), a batch at a time."""
        self._next_move = now + MOVE_INTERVAL
        try:
            if retention.move_finished(using=self._using) >= MOVE_BATCH:
                self._next_move = now  # more are waiting: at the next turn
        except Exception as exc:  # housekeeping must never stop the pool
            if not self._moving_failed:
                log.warning("moving finished intents out failed: %s", cause_text(exc))
            self._moving_failed = True
        else:
            if self._moving_failed:
                log.info("moving finished intents out works again")
            self._moving_failed = False

    def stop(self) -> None:
        """At the pool's exit: write the dashboard's last counts, without a depth sample."""
        rollup.flush(using=self._using, sample=False)

    def _report(self, now: float, running: int) -> None:
        elapsed = max(now - self._since, 1e-9)
        totals = self._tally.totals()
        counts = totals - self._reported
        total = sum(counts.values())
        log.info(
            "%d attempt(s) finished in the last %.0f s (%.2f/s): %s; %d running",
            total,
            elapsed,
            total / elapsed,
            ", ".join(f"{counts[name]} {name}" for name in COLUMNS),
            running,
        )
        self._reported = totals
        self._since, self._next_report = now, now + self._report_interval

    def stopped(self) -> None:
        """The pool's last line: every outcome since it started, and the rate."""
        log.info("stopped: %s", self._tally.line())
