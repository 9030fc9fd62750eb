"""Retention: compact, then (only if asked to) delete old terminal intents.

An intent's id is its idempotency key: while the row exists, enqueueing the
same event again is a no-op. So the default way to reclaim space is to
*compact* a finished intent (drop its payload and error, keep the row), and
rows are *deleted* only after a second window that the project sets knowingly:
once a row is gone, the same event enqueued again runs again.

On PostgreSQL finished intents lie in a partition per day (migration 0018,
``store/postgresql/days.py``): a prune first moves those still in the live
partition out, then drops every day whose rows are all past the delete
window of their state (nothing left for vacuum but the day's keys), and
deletes what is left
row by row as below: the days the window cuts through, and the rows of days
that have no partition.

Both phases work in bounded batches. A batch reads at most ``batch_size`` ids
through the ``(state, updated_at)`` index, then writes those rows by primary
key in one short statement, so locks are held for one batch at a time, never
across the table. Pages advance by ``(updated_at, id)`` keyset, so one pass
reads each old row once however many batches it takes. Only ``completed`` and
``cancelled`` intents are ever selected, and each write repeats the state and
age conditions, so a row is touched only if it still qualifies when written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections, router
from django.db.models import Q
from django.utils import timezone

from django_intents.conf import get_settings
from django_intents.managers import IntentQuerySet
from django_intents.models import Intent
from django_intents.rules.states import TERMINAL
from django_intents.store import backend_for
from django_intents.store.clock import server_now


@dataclass
class PruneReport:
    """What one :func:`prune` call did (with ``dry_run``: would do), per state."""

    dry_run: bool = False
    compacted: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    #: False when ``max_batches`` stopped the pass while rows were still waiting.
    finished: bool = True

    @property
    def total(self) -> int:
        return sum(self.compacted.values()) + sum(self.deleted.values())


@dataclass(frozen=True)
class _Phase:
    """One kind of work on one state: the rows it selects and what it does to a batch."""

    counts: dict[str, int]
    state: str
    rows: IntentQuerySet
    write: Callable[[IntentQuerySet], int]


def prune(
    now: datetime | None = None,
    *,
    batch_size: int = 500,
    max_batches: int | None = None,
    dry_run: bool = False,
    using: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> PruneReport:
    """Apply ``INTENTS["RETENTION"]`` to terminal intents, ages counted from ``updated_at``.

    Deletion runs before compaction, so no row is rewritten just before it goes.
    ``max_batches`` bounds the writes of one call, which is how running workers
    prune a little at a time; ``report.finished`` says whether work was left.
    Call it outside a transaction: inside one, every batch's locks are held
    until the caller commits. Concurrent calls are safe: a batch another caller
    already handled simply matches no rows, and is not counted. ``using`` is
    the database alias (default: the router's choice for ``Intent``).
    ``progress`` is called after each batch with the rows it handled.
    """
    using = using or router.db_for_write(Intent)
    now = server_now(using) if now is None else now
    if timezone.is_naive(now):
        raise ValueError(f"now must be an aware datetime, not naive {now}")
    _check_count("batch_size", batch_size)
    if max_batches is not None:
        _check_count("max_batches", max_batches)
    report = PruneReport(dry_run=dry_run)
    intents = Intent.objects.using(using)
    days = getattr(backend_for(connections[using], Intent), "days", None)
    if days is not None:
        if not dry_run and max_batches is None:  # the pools move theirs every second
            while days.move_out():
                pass
        counts, dropped = days.drop_days(_cutoffs(now), dry_run=dry_run)
        for state, count in counts.items():
            report.deleted[state] = report.deleted.get(state, 0) + count
        if progress is not None and counts:
            progress(sum(counts.values()))
        if dry_run and dropped:  # their rows are counted: the phases leave them out
            intents = intents.extra(  # noqa: S610 - days are integers, sent as parameters
                where=[f"part NOT IN ({', '.join(['%s'] * len(dropped))})"], params=dropped
            )
    phases = _phases(report, now, intents)
    for phase in phases:
        phase.counts.setdefault(phase.state, 0)
    for phase in phases:
        if not _run(phase, report, batch_size, max_batches, progress):
            report.finished = False
            break
    return report


def _cutoffs(now: datetime) -> dict[str, datetime | None]:
    """Per terminal state, the time before which its intents are deleted (None: kept)."""
    retention = get_settings().retention or {}
    cutoffs: dict[str, datetime | None] = {}
    for state in TERMINAL:
        window = retention.get(state)
        cutoffs[state] = None if window is None or window.delete is None else now - window.delete
    return cutoffs


# The intents one move takes out of the live partition (store/postgresql/days.py).
MOVE_BATCH = 2_000


def move_finished(*, using: str | None = None) -> int:
    """Move one batch of finished intents out of the live partition (PostgreSQL); how many.

    The pools call it every second (``worker/housekeeping.py``); elsewhere it does nothing.
    """
    using = using or router.db_for_write(Intent)
    days = getattr(backend_for(connections[using], Intent), "days", None)
    return 0 if days is None else int(days.move_out(limit=MOVE_BATCH))


def _phases(report: PruneReport, now: datetime, intents: IntentQuerySet) -> list[_Phase]:
    retention = get_settings().retention or {}
    phases = []
    for state in TERMINAL:
        window = retention.get(state)
        if window is not None and window.delete is not None:
            rows = intents.filter(state=state, updated_at__lte=now - window.delete)
            phases.append(_Phase(report.deleted, state, rows, _delete))
    for state in TERMINAL:
        window = retention.get(state)
        if window is not None and window.compact is not None:
            rows = intents.filter(state=state, updated_at__lte=now - window.compact)
            if window.delete is not None:
                # Older rows belong to the delete phase; a dry run must not count them twice.
                rows = rows.filter(updated_at__gt=now - window.delete)
            # Compacted rows no longer match, so a second pass rewrites nothing.
            rows = rows.filter(Q(payload__isnull=False) | ~Q(last_error=""))
            phases.append(_Phase(report.compacted, state, rows, _compact))
    return phases


def _delete(batch: IntentQuerySet) -> int:
    _, per_model = batch.delete()
    return per_model.get(Intent._meta.label, 0)


def _compact(batch: IntentQuerySet) -> int:
    # update() leaves updated_at alone: the age keeps counting from the terminal
    # transition, so compacting never pushes the delete window back.
    return batch.update(payload=None, last_error="", last_traceback="")


def to_prune(now: datetime | None = None, *, using: str | None = None) -> int:
    """How many rows a :func:`prune` at ``now`` would handle: one count per phase."""
    using = using or router.db_for_write(Intent)
    now = server_now(using) if now is None else now
    return sum(p.rows.count() for p in _phases(PruneReport(), now, Intent.objects.using(using)))


def _run(
    phase: _Phase,
    report: PruneReport,
    batch_size: int,
    max_batches: int | None,
    progress: Callable[[int], None] | None,
) -> bool:
    """Work through one phase; return False if ``max_batches`` ran out first."""
    after: tuple[datetime, str] | None = None
    while True:
        rows = phase.rows.page_by_age(after, batch_size)
        if not rows:
            return True
        if max_batches is not None and report.batches >= max_batches:
            return False
        report.batches += 1
        done = len(rows) if report.dry_run else phase.write(_page(phase.rows, after, rows[-1]))
        phase.counts[phase.state] += done
        if progress is not None:
            progress(len(rows))
        if len(rows) < batch_size:
            return True
        after = rows[-1]


def _page(
    rows: IntentQuerySet, after: tuple[datetime, str] | None, last: tuple[datetime, str]
) -> IntentQuerySet:
    """The rows of one page, as a range of the finished index from ``after`` to ``last``.

    Written by their ids, a page cost a lookup in the primary key and a
    heap page per row, scattered over the table: 42 s for 1,000,000 rows on
    PostgreSQL (``bench/history.py``). As a range, the write walks the
    finished index in order over rows that finished together, and so lie
    together. A row the page read that no longer qualifies is left alone (the
    phase's conditions are repeated), and none can enter the range: a row
    that finishes now is younger than the window.
    """
    at, last_id = last
    page = rows.filter(Q(updated_at__lte=at), Q(updated_at__lt=at) | Q(id__lte=last_id))
    if after is not None:
        since, after_id = after
        page = page.filter(Q(updated_at__gte=since), Q(updated_at__gt=since) | Q(id__gt=after_id))
    return page


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")
