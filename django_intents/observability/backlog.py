"""What is waiting, per kind: the one query behind the admin summary, the gauges and health.

"Due" is ``states.due``: a pending intent past ``next_at`` (waiting since
then) or a running one whose lease ran out (waiting since ``claim_until``).
One grouped query, so its cost does not grow with the number of kinds.

"Running since" is a running intent's ``next_at``: when the attempt it is in
became due. The table keeps no time of the claim itself (a lease renewal
moves ``updated_at`` and ``claim_until`` alike, and a claim leaves ``next_at``
as it was), so this is the earliest the attempt can have started: the figure
includes any wait for a worker before the claim, which the oldest due age
bounds on its own. A handler that hangs makes it grow without end, however
faithfully its pool renews the lease.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.db import router
from django.db.models import Count, DateTimeField, Min, Q, QuerySet, Value

from django_intents.conf import get_settings
from django_intents.models import Intent, PausedKind
from django_intents.rules import states
from django_intents.rules.limits import Limits, held_back
from django_intents.store.clock import server_now

PAUSED = "paused"  # not a state: the mark of a paused kind's row in the backlog query


@dataclass(frozen=True)
class KindBacklog:
    kind: str
    pending: int
    running: int
    due: int
    oldest_due: datetime | None  # when the longest-waiting due intent became claimable
    limited: int = 0  # due intents that INTENTS["LIMITS"] keeps from running now
    paused: bool = False  # no claim takes the kind (``Intent.objects.pause``)
    # the running intent that has been running longest, since (the module's "running since")
    oldest_running: datetime | None = None

    @property
    def active(self) -> int:
        return self.pending + self.running


@dataclass(frozen=True)
class Backlog:
    now: datetime
    states: Counter[str]  # intents per state; finished states only when asked for
    kinds: list[KindBacklog]  # kinds with active intents or paused, by name
    # False: pending and due counts are the planner's estimates (``estimate.py``)
    exact: bool = True

    @property
    def due(self) -> int:
        return sum(kind.due for kind in self.kinds)

    @property
    def paused(self) -> set[str]:
        return {kind.kind for kind in self.kinds if kind.paused}

    @property
    def oldest_due(self) -> datetime | None:
        times = [kind.oldest_due for kind in self.kinds if kind.oldest_due is not None]
        return min(times) if times else None

    @property
    def active(self) -> int:
        return self.states[states.State.PENDING] + self.states[states.State.RUNNING]


def read_backlog(
    now: datetime | None = None, *, finished: bool = False, using: str | None = None
) -> Backlog:
    """Read the backlog at ``now``; ``finished`` also counts completed and cancelled intents.

    Without ``finished`` only active rows are read, which the claim index can
    serve however many finished intents the table keeps. Paused kinds are
    listed even with nothing waiting, so that they are seen and resumed.
    """
    using = using or router.db_for_read(Intent)
    now = server_now(using) if now is None else now
    due = states.due(now)
    rows = Intent.objects.using(using).order_by()
    if not finished:
        rows = rows.filter(state__in=states.ACTIVE)
    grouped = rows.values_list("kind", "state").annotate(
        n=Count("pk"),
        due=Count("pk", filter=due),
        since=Min(states.due_since(), filter=due),
        running_since=Min("next_at", filter=Q(state=states.State.RUNNING)),
    )
    # The paused kinds ride along in the same query, as rows of a state of their own.
    pauses = (
        PausedKind.objects.using(using)
        .order_by()
        .annotate(
            state=Value(PAUSED),
            n=Value(0),
            due=Value(0),
            since=Value(None, output_field=DateTimeField()),
            running_since=Value(None, output_field=DateTimeField()),
        )
        .values_list("kind", "state", "n", "due", "since", "running_since")
    )
    by_state: Counter[str] = Counter()
    counts: dict[str, Counter[str]] = {}
    oldest: dict[str, datetime] = {}
    running: dict[str, datetime] = {}
    paused: set[str] = set()
    for kind, state, n, due_count, since, running_since in grouped.union(pauses, all=True):
        if state == PAUSED:
            paused.add(kind)
            counts.setdefault(kind, Counter())
            continue
        by_state[state] += n
        if state not in states.ACTIVE:
            continue
        tally = counts.setdefault(kind, Counter())
        tally[state] += n
        tally["due"] += due_count
        if since is not None and (kind not in oldest or since < oldest[kind]):
            oldest[kind] = since
        if running_since is not None:
            running[kind] = running_since
    limits = {
        k: v
        for k, v in get_settings().limits.items()
        if counts.get(k, Counter())["due"] and k not in paused  # a pause holds all, not a limit
    }
    held = _held_back(rows, limits, now) if limits else {}
    kinds = [
        KindBacklog(
            kind,
            tally[states.State.PENDING],
            tally[states.State.RUNNING],
            tally["due"],
            oldest.get(kind),
            held.get(kind, 0),
            kind in paused,
            running.get(kind),
        )
        for kind, tally in sorted(counts.items())
    ]
    return Backlog(now, by_state, kinds)


def _held_back(rows: QuerySet[Intent], limits: Limits, now: datetime) -> dict[str, int]:
    """How many due intents of each limited kind its limit holds back: a second grouped
    query, per target, run only for limited kinds that have due intents."""
    live = states.live(now)
    per_target = (
        rows.filter(state__in=states.ACTIVE, kind__in=list(limits))
        .values_list("kind", "target")
        .annotate(due=Count("pk", filter=states.due(now)), live=Count("pk", filter=live))
    )
    due, running = {}, {}
    for kind, target, due_count, live_count in per_target:
        due[kind, target], running[kind, target] = due_count, live_count
    return held_back(limits, due, running)
