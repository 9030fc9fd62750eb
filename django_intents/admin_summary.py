"""The summary above the intents list: states, and per kind what waits, what a limit holds
and whether the kind is paused.

One read of the backlog (``backlog.read_backlog``) shaped for the template
``admin/django_intents/intent/summary.html``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .backlog import read_backlog
from .conf import get_settings
from .humanize import short_duration
from .states import State


def _waiting(age: timedelta | None) -> str:
    return "" if age is None else short_duration(age.total_seconds())


@dataclass(frozen=True)
class StateCount:
    value: str
    label: str
    count: int


@dataclass(frozen=True)
class KindSummary:
    kind: str
    active: int
    due: int
    oldest_due_age: timedelta | None
    limited: int = 0  # due, but held back by its LIMITS entry
    limit: str = ""  # that entry, as a person reads it
    paused: bool = False  # no claim takes the kind

    @property
    def waiting(self) -> str:
        return _waiting(self.oldest_due_age)


@dataclass(frozen=True)
class QueueSummary:
    states: list[StateCount]
    kinds: list[KindSummary]
    due: int
    oldest_due_age: timedelta | None
    limits: bool = False  # whether INTENTS["LIMITS"] is set: the table then has its column

    @property
    def waiting(self) -> str:
        return _waiting(self.oldest_due_age)


def queue_summary(now: datetime | None = None) -> QueueSummary:
    """The backlog (``backlog.read_backlog``, one query) as the summary template reads it."""
    backlog = read_backlog(now, finished=True)

    def age(since: datetime | None) -> timedelta | None:
        return None if since is None else backlog.now - since

    return QueueSummary(
        states=[
            StateCount(value, str(label), backlog.states[value]) for value, label in State.choices
        ],
        kinds=[
            KindSummary(
                k.kind, k.active, k.due, age(k.oldest_due), k.limited, _limit(k.kind), k.paused
            )
            for k in backlog.kinds
        ],
        due=backlog.due,
        oldest_due_age=age(backlog.oldest_due),
        limits=bool(get_settings().limits),
    )


def _limit(kind: str) -> str:
    limit = get_settings().limits.get(kind)
    if limit is None:
        return ""
    caps = [("running", limit.running), ("per target", limit.per_target)]
    return ", ".join(f"{name} ≤ {cap}" for name, cap in caps if cap is not None)
