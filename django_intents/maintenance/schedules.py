"""Schedules without a leader (SPEC §11): every pool enqueues the slots that are due.

A slot is an ordinary intent whose id follows from the schedule's name and
the slot's start (``Schedule.event_id``), so any number of pools on any
number of hosts may enqueue it at once: the idempotent insert keeps one row.
There is no scheduler state besides those rows. A schedule's history is its
slot intents, and the latest of them is its last slot.

``enqueue_due`` costs one read (by primary key) per call when every slot it
looks at exists, and a batch insert when some do not. Looking for the last
slot by primary key keeps it off any scan; only a schedule none of whose
recent slots exist asks whether it has older ones, once, before it catches up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from django.db import router

from django_intents.conf import get_settings
from django_intents.managers import IntentManager
from django_intents.models import Intent
from django_intents.rules import validation
from django_intents.rules.cron import STAMP, Schedule
from django_intents.rules.identity import digest
from django_intents.store.clock import now_or

# A slot is due for this long after it starts: enqueued whatever the policy.
DUE_FOR = timedelta(seconds=60)
# ``catch_up="all"`` enqueues at most this many missed slots, the most recent.
MAX_CATCH_UP = 100


def enqueue_due(
    now: datetime | None = None, kinds: Iterable[str] | None = None, *, using: str | None = None
) -> list[str]:
    """Enqueue the due (and, per ``catch_up``, missed) slots of every schedule of ``kinds``.

    Returns the ids of the slots it enqueued or found already enqueued, by
    schedule name, then oldest first. Without schedules of those kinds it
    touches no database. ``now=None`` is the current time, as for the manager.
    """
    manager = _manager(using)
    chosen = [s for s in schedules(kinds) if _home(s, manager.db)]
    if not chosen:
        return []
    now = now_or(now, manager.db)
    plans = [_Plan(schedule, now) for schedule in chosen]
    wanted = {_id(p.schedule, slot) for p in plans for slot in (*p.due, *p.missed)}
    existing = set(manager.filter(pk__in=wanted).values_list("pk", flat=True)) if wanted else set()
    slots = [(p.schedule, slot) for p in plans for slot in p.enqueued(existing, manager)]
    items = [
        {
            "kind": schedule.kind,
            "event_id": schedule.event_id(slot),
            "target": schedule.target,
            "payload": schedule.payload,
            "next_at": slot,
        }
        for schedule, slot in slots
        if _id(schedule, slot) not in existing
    ]
    if items:
        manager.enqueue_many(items, now=now)
    return [_id(schedule, slot) for schedule, slot in slots]


def schedules(kinds: Iterable[str] | None = None) -> list[Schedule]:
    """The configured schedules (of ``kinds``, when given), by name."""
    wanted = validation.kinds(kinds)
    configured = get_settings().schedules
    return [
        configured[name]
        for name in sorted(configured)
        if wanted is None or configured[name].kind in wanted
    ]


@dataclass(frozen=True)
class Slots:
    """A schedule as the admin and ``intents_schedules`` show it."""

    schedule: Schedule
    last: datetime | None  # the latest slot intent in the table
    next: datetime | None  # the first slot that starts after now

    @property
    def last_utc(self) -> str:
        """``last`` as slot event ids spell it (``2026-01-01T12:00:00Z``); ``""`` if none."""
        return "" if self.last is None else self.last.astimezone(UTC).strftime(STAMP)

    @property
    def next_utc(self) -> str:
        return "" if self.next is None else self.next.astimezone(UTC).strftime(STAMP)


def listing(now: datetime | None = None, *, using: str | None = None) -> list[Slots]:
    """Every schedule (that ``using`` holds, ``_home``) with its last and next slot: one
    query per schedule."""
    manager = _manager(using)
    now = now_or(now, manager.db)
    rows = []
    for schedule in [s for s in schedules() if _home(s, manager.db)]:
        event_ids = (
            manager.filter(kind=schedule.kind, event_id__startswith=schedule.prefix)
            .order_by("-event_id")
            .values_list("event_id", flat=True)
        )
        last = next((s for e in event_ids[:1] if (s := schedule.slot_of(e)) is not None), None)
        rows.append(Slots(schedule, last, schedule.after(now)))
    return rows


class _Plan:
    """What one schedule may enqueue at ``now``: its due slots and its missed candidates.

    ``due`` are the slots that started at most ``DUE_FOR`` ago; ``missed`` are
    the slots before them that the catch-up policy could enqueue (none, the
    most recent one, or up to ``MAX_CATCH_UP``), oldest first.
    """

    def __init__(self, schedule: Schedule, now: datetime) -> None:
        self.schedule = schedule
        latest = schedule.latest(now)
        self.due: tuple[datetime, ...] = ()
        if latest is not None and latest >= now - DUE_FOR:
            # Cron counts in minutes: at most two slots fit in one closed minute.
            self.due = tuple(s for s in (*schedule.before(latest, 1), latest) if s >= now - DUE_FOR)
        self.missed: tuple[datetime, ...] = ()
        count = {"latest": 1, "all": MAX_CATCH_UP}.get(schedule.catch_up, 0)
        # The most recent slot before the due ones: the first that can be missed.
        previous = next(iter(schedule.before(self.due[0], 1)), None) if self.due else latest
        if count and previous is not None:
            self.missed = (*schedule.before(previous, count - 1), previous)

    def enqueued(self, existing: set[str], manager: IntentManager) -> tuple[datetime, ...]:
        """The slots to have in the table: the due ones, and those missed since the last slot."""
        if not self.missed or any(_id(self.schedule, s) in existing for s in self.due):
            return self.due  # nothing is missed: the last slot is a due one, or none is looked at
        stored = [s for s in self.missed if _id(self.schedule, s) in existing]
        if stored:
            return (*(s for s in self.missed if s > stored[-1]), *self.due)
        if self._has_history_before(self.missed[0], manager):
            return (*self.missed, *self.due)
        # A schedule with no slot intent yet has missed nothing before its most recent slot.
        return self.due or self.missed[-1:]

    def _has_history_before(self, slot: datetime, manager: IntentManager) -> bool:
        schedule = self.schedule
        return bool(
            manager.filter(
                kind=schedule.kind,
                event_id__startswith=schedule.prefix,
                event_id__lt=schedule.event_id(slot),
            )
            .order_by()
            .exists()
        )


def _home(schedule: Schedule, using: str) -> bool:
    """Whether ``using`` holds the slots of ``schedule``.

    With one database it holds all of them. With several
    (``INTENTS["DATABASES"]``, issue 41) a schedule lives on the database the
    routers pick for its kind and target, and only the pools of that database
    enqueue its slots: each slot once in the whole fleet, beside the slots
    before it that its catch-up reads.
    """
    if get_settings().databases is None:
        return True
    home = router.db_for_write(Intent, kind=schedule.kind, target=schedule.target)
    return bool(home == using)


def _id(schedule: Schedule, slot: datetime) -> str:
    return digest(schedule.kind, schedule.event_id(slot), schedule.target)


def _manager(using: str | None) -> IntentManager:
    return cast(IntentManager, Intent.objects.db_manager(using or router.db_for_write(Intent)))
