"""The per-minute rollup behind the admin's dashboard: counted in memory, flushed by the pool.

Each finished attempt (``signals.attempt_finished``) adds one to its kind's
minute in a ``Tally``: completed, failed, snoozed or cancelled, and its
duration. A pool's housekeeping calls :func:`flush` every ``FLUSH_INTERVAL``
seconds and once at exit, on the pool's own connection: one ``INSERT`` adds
the tallied minutes to the ``Rollup`` table (``store/rollup.py``: adding, not
overwriting, so pools flushing the same minute all count). Once per minute
a flush also samples each kind's queue depth (due and running intents), and
now and then deletes the rows older than ``KEEP``. The table so holds a few
rows per kind and minute for two days, whatever the intents table holds, and
the dashboard reads only it.

Minutes are stamped by this host's wall clock when the attempt finishes, and
moved by whole minutes to the database server's clock when flushed
(``store/clock.py``), so pools on skewed hosts fill the same minutes.

A failed write gives the counts back to the tally, to be added by the next
flush; a tally that is never flushed (a process that sends the signal but
runs no pool) forgets minutes older than ``KEEP``, so it stays bounded.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, router
from django.utils import timezone

from django_intents.models import Intent, Rollup
from django_intents.observability import log
from django_intents.observability.backlog import Backlog, read_backlog
from django_intents.observability.estimate import estimate_backlog
from django_intents.rules.states import ACTIVE
from django_intents.signals import Outcome, attempt_finished
from django_intents.store import backend_for
from django_intents.store.admin import kinds as kinds_in_table
from django_intents.store.clock import server_now
from django_intents.store.rollup import RollupRow, upsert

FLUSH_INTERVAL = 15.0  # seconds between a pool's flushes: the dashboard lags by at most this
KEEP = timedelta(days=2)
PRUNE_INTERVAL = 600.0  # seconds between deletions of rows older than KEEP, per pool
EXACT_DEPTH = 10_000  # more active intents than this: the depth is the planner's estimate
MINUTE = timedelta(minutes=1)

# The column each outcome counts in; a fenced attempt's result was dropped, so it
# counts only as an attempt. An outcome not listed (a timeout) is a failure.
COLUMNS: dict[str, str | None] = {
    Outcome.SUCCESS: "completed",
    Outcome.ERROR: "failed",
    Outcome.STOPPED: "cancelled",
    Outcome.SNOOZED: "snoozed",
    Outcome.FENCED: None,
}


def minute_of(moment: datetime) -> datetime:
    """The start of ``moment``'s minute, in UTC."""
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


class Tally:
    """Finished attempts per kind and minute since the last flush; thread-safe.

    The pool's threads (and its event loop) finish attempts while the loop
    flushes, so every change is made under one lock, held only to update a
    dictionary or swap it out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[datetime, str], RollupRow] = {}
        self._oldest: datetime | None = None
        self._sampled: datetime | None = None  # the minute of the last depth sample
        self._pruned_at = -math.inf
        # The minute now, as a number and as the datetime that keys the rows: the
        # pool's loop counts every attempt, so the datetime is made once a minute.
        self._now: tuple[int, datetime] = (-1, datetime.min.replace(tzinfo=UTC))

    def record(self, kind: str, outcome: str, duration: float, at: datetime | None = None) -> None:
        """Count one finished attempt of ``kind`` in the minute of ``at`` (now)."""
        if at is None:
            number, minute = self._now
            if number != (now := int(time.time() // 60)):
                minute = datetime.fromtimestamp(now * 60, UTC)
                self._now = (now, minute)
        else:
            minute = minute_of(at)
        column = COLUMNS.get(outcome, "failed")
        duration = max(duration, 0.0)
        with self._lock:
            row = self._rows.get((minute, kind))
            if row is None:
                row = self._rows[minute, kind] = RollupRow(minute, kind)
                self._forget_before(minute - KEEP)
            if column is not None:
                setattr(row, column, getattr(row, column) + 1)
            row.attempts += 1
            row.duration_sum += duration
            row.duration_max = max(row.duration_max, duration)

    def _forget_before(self, cutoff: datetime) -> None:
        if self._oldest is not None and self._oldest >= cutoff:
            return
        self._rows = {key: row for key, row in self._rows.items() if key[0] >= cutoff}
        self._oldest = min((key[0] for key in self._rows), default=None)

    def take(self) -> list[RollupRow]:
        """The rows tallied so far, which the tally forgets."""
        with self._lock:
            rows, self._rows, self._oldest = list(self._rows.values()), {}, None
        return rows

    def give_back(self, rows: list[RollupRow]) -> None:
        """Add ``rows`` (taken, then not written) back, for the next flush."""
        with self._lock:
            for taken in rows:
                row = self._rows.get((taken.minute, taken.kind))
                if row is None:
                    self._rows[taken.minute, taken.kind] = taken
                else:
                    _add(row, taken)
            self._oldest = min((key[0] for key in self._rows), default=None)

    def flush(self, using: str | None = None, *, sample: bool = True) -> int:
        """Write what was tallied to the ``Rollup`` table on ``using``; return the rows written.

        With ``sample``, the first flush of each minute adds each kind's queue
        depth. Raises the database's error after giving the counts back.
        """
        using = using or router.db_for_write(Rollup)
        now = server_now(using)
        shift = MINUTE * round((now - timezone.now()) / MINUTE)
        minute = minute_of(now)
        depth: dict[str, RollupRow] = {}
        if sample and self._sampled != minute:
            for backlog in sample_depth(now, using).kinds:
                depth[backlog.kind] = RollupRow(
                    minute, backlog.kind, due=backlog.due, running=backlog.running
                )
        taken = self.take()
        rows: dict[tuple[datetime, str], RollupRow] = {}
        for row in taken:
            moved = replace(row, minute=row.minute + shift)
            rows[moved.minute, moved.kind] = moved
        for kind, sampled in depth.items():
            row = rows.setdefault((minute, kind), sampled)
            row.due, row.running = sampled.due, sampled.running
        try:
            upsert(connections[using], Intent, list(rows.values()))
        except Exception:
            self.give_back(taken)
            raise
        if sample:
            self._sampled = minute
        if time.monotonic() >= self._pruned_at + PRUNE_INTERVAL:
            Rollup.objects.using(using).filter(minute__lt=minute - KEEP).delete()
            self._pruned_at = time.monotonic()
        return len(rows)


def _add(row: RollupRow, other: RollupRow) -> None:
    row.completed += other.completed
    row.failed += other.failed
    row.snoozed += other.snoozed
    row.cancelled += other.cancelled
    row.attempts += other.attempts
    row.duration_sum += other.duration_sum
    row.duration_max = max(row.duration_max, other.duration_max)


def sample_depth(now: datetime, using: str) -> Backlog:
    """Each kind's due and running intents at ``now``: exact while the active intents
    are few, the planner's estimates past ``EXACT_DEPTH`` of them (where it has any)."""
    active = Intent.objects.using(using).filter(state__in=ACTIVE).order_by()
    if active.values("pk")[: EXACT_DEPTH + 1].count() > EXACT_DEPTH:
        kinds = kinds_in_table(backend_for(connections[using], Intent))
        estimated = estimate_backlog(now, kinds, using)
        if estimated is not None:
            return estimated
    return read_backlog(now, using=using)


TALLY = Tally()
"""The process's tally, which the receiver feeds and the pool flushes."""


_failing = False


def flush(using: str | None = None, *, sample: bool = True) -> None:
    """Flush the process's tally (``Tally.flush``); a failure is logged, never raised,
    so that the dashboard's bookkeeping cannot stop a pool. It is logged once, until a
    flush works again: a pool started before ``migrate`` would otherwise warn every
    ``FLUSH_INTERVAL``."""
    global _failing
    try:
        TALLY.flush(using, sample=sample)
    except Exception as exc:
        if not _failing:
            log.warning(
                "writing the dashboard's rollup failed (retried; logged again once it "
                "works): %s: %s",
                type(exc).__name__,
                exc,
            )
        _failing = True
    else:
        if _failing:
            log.info("writing the dashboard's rollup works again")
        _failing = False


def _on_attempt_finished(
    sender: Any, *, kind: str, outcome: str, duration: float, **kwargs: Any
) -> None:
    TALLY.record(kind, outcome, duration)


def connect() -> None:
    """Connect the receiver; called from ``AppConfig.ready``, harmless twice."""
    attempt_finished.connect(_on_attempt_finished, dispatch_uid="django_intents.rollup.attempt")
