"""The summary above the intents list: states, and per kind what waits, what a limit holds
and whether the kind is paused.

One read of the backlog (``observability.backlog.read_backlog``: the unfinished
intents, exactly) and a bounded count of each finished state
(``changelist.bounded_count``: exact up to ``changelist.EXACT``, past that the
planner's estimate), shaped for the template
``admin/django_intents/intent/summary.html``. Finished intents are most of a
big table, and counting them exactly would read all of it on every page.

The column titles of its table and of the schedules' below it are here too:
the templates loop over them (``columns.html``), as Django's change list loops
over its headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import router
from django.utils.translation import gettext_lazy

from django_intents.admin.changelist import bounded_count, exceeds_bound, present_kinds
from django_intents.admin.humanize import short_duration
from django_intents.conf import get_settings
from django_intents.models import Intent
from django_intents.observability.backlog import read_backlog
from django_intents.observability.estimate import estimate_backlog
from django_intents.rules.states import ACTIVE, TERMINAL, State
from django_intents.store.clock import server_now

SCHEDULE_COLUMNS = (
    gettext_lazy("Schedule"),
    gettext_lazy("Cron"),
    gettext_lazy("Time zone"),
    gettext_lazy("Kind"),
    gettext_lazy("Last slot (UTC)"),
    gettext_lazy("Next slot (UTC)"),
)
KIND_COLUMNS = (
    gettext_lazy("Kind"),
    gettext_lazy("Pending or running"),
    gettext_lazy("Due now"),
    gettext_lazy("Oldest due waiting"),
)
LIMITED_COLUMN = gettext_lazy("Held back by a limit")
PAUSED_COLUMN = gettext_lazy("Paused")


def _waiting(age: timedelta | None) -> str:
    return "" if age is None else short_duration(age.total_seconds())


@dataclass(frozen=True)
class StateCount:
    value: str
    label: str
    count: int
    exact: bool = True  # False: the planner's estimate


@dataclass(frozen=True)
class KindSummary:
    kind: str
    active: int
    due: int
    oldest_due_age: timedelta | None
    limited: int = 0  # due, but held back by its LIMITS entry
    limit: str = ""  # that entry, as a person reads it
    paused: bool = False  # no claim takes the kind
    exact: bool = True  # False: active and due are estimates, limited is not known

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
    exact: bool = True  # False: ``due`` is an estimate

    @property
    def waiting(self) -> str:
        return _waiting(self.oldest_due_age)

    @property
    def columns(self) -> list[str]:
        """The titles of the kinds table: the limit's column only where limits are set."""
        limited = [LIMITED_COLUMN] if self.limits else []
        return [str(title) for title in (*KIND_COLUMNS, *limited, PAUSED_COLUMN)]


def queue_summary(now: datetime | None = None, *, using: str | None = None) -> QueueSummary:
    """The backlog and the finished counts as the summary template reads them.

    The backlog is exact while at most ``changelist.EXACT`` intents are
    unfinished, and estimated past that where the database can
    (``observability.estimate``); finished states are bounded counts.
    """
    using = using or router.db_for_read(Intent)
    now = server_now(using) if now is None else now
    kinds = present_kinds(using)
    rows = Intent.objects.using(using)
    backlog = None
    if exceeds_bound(rows.filter(state__in=ACTIVE), kinds):
        backlog = estimate_backlog(now, kinds, using)
    if backlog is None:
        backlog = read_backlog(now, using=using)
    counts: dict[str, tuple[int, bool]] = {
        State.PENDING: (backlog.states[State.PENDING], backlog.exact),
        State.RUNNING: (backlog.states[State.RUNNING], True),
    }
    for state in TERMINAL:
        # Through the (kind, state, event_id) index: every kind, one state.
        counts[state] = bounded_count(rows.filter(state=state), kinds)

    def age(since: datetime | None) -> timedelta | None:
        return None if since is None else backlog.now - since

    return QueueSummary(
        states=[StateCount(value, str(label), *counts[value]) for value, label in State.choices],
        kinds=[
            KindSummary(
                k.kind,
                k.active,
                k.due,
                age(k.oldest_due),
                k.limited,
                _limit(k.kind),
                k.paused,
                backlog.exact,
            )
            for k in backlog.kinds
        ],
        due=backlog.due,
        oldest_due_age=age(backlog.oldest_due),
        limits=bool(get_settings().limits),
        exact=backlog.exact,
    )


def _limit(kind: str) -> str:
    limit = get_settings().limits.get(kind)
    if limit is None:
        return ""
    caps = [("running", limit.running), ("per target", limit.per_target)]
    return ", ".join(f"{name} ≤ {cap}" for name, cap in caps if cap is not None)
