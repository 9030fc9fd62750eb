"""The backlog of a big queue, read at a cost that does not follow its size.

``backlog.read_backlog`` reads every unfinished intent: exact, and cheap while
they are few. Past ``admin.changelist.EXACT`` of them (a backlog of a hundred
thousand after a partner's outage) the admin's summary reads this instead:

- pending and due-pending intents per kind are the planner's estimates
  (``store.admin.estimates``: one ``EXPLAIN`` for them all), labelled as such in the page;
- running intents per kind, the expired leases among them and when the
  longest-running one became due (``backlog``'s "running since") are read
  exactly: a running intent holds a worker's slot, so there are few;
- the oldest due intent of each kind is exact: one ``MIN`` per kind, which the
  planner answers from the claim index or the kind index, whichever is cheaper;
- what ``INTENTS["LIMITS"]`` holds back is not read (``limited`` is 0): it
  would take a count per target of every due intent.

Where the database keeps no estimates (SQLite), the exact backlog is read whatever its size.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.db import connections
from django.db.models import Count, Min

from django_intents.models import Intent, PausedKind
from django_intents.observability.backlog import Backlog, KindBacklog
from django_intents.rules.states import State
from django_intents.rules.states import expired as lease_expired
from django_intents.store import backend_for
from django_intents.store.admin import estimates, oldest_due


def estimate_backlog(now: datetime, kinds: list[str], using: str) -> Backlog | None:
    """The backlog at ``now`` of ``kinds`` (all the table holds), or ``None`` where the
    database gives no estimates."""
    rows = Intent.objects.using(using).order_by()
    waiting = [rows.filter(kind=kind, state=State.PENDING) for kind in kinds]
    due_now = [queryset.filter(next_at__lte=now) for queryset in waiting]
    guesses = estimates(waiting + due_now) if kinds else []
    if guesses is None:
        return None
    pending = dict(zip(kinds, guesses[: len(kinds)], strict=True))
    due = dict(zip(kinds, guesses[len(kinds) :], strict=True))
    running = {
        kind: (n, expired, since)
        for kind, n, expired, since in rows.filter(state=State.RUNNING)
        .values_list("kind")
        .annotate(
            n=Count("pk"), expired=Count("pk", filter=lease_expired(now)), since=Min("next_at")
        )
    }
    oldest = oldest_due(backend_for(connections[using], Intent), kinds, now=now)
    paused = set(PausedKind.objects.using(using).values_list("kind", flat=True))
    states: Counter[str] = Counter()
    backlog = []
    for kind in sorted(set(kinds) | paused):
        n, expired, since = running.get(kind, (0, 0, None))
        if not (pending.get(kind) or n or kind in paused):
            continue
        states[State.PENDING] += pending.get(kind, 0)
        states[State.RUNNING] += n
        backlog.append(
            KindBacklog(
                kind,
                pending.get(kind, 0),
                n,
                due.get(kind, 0) + expired,
                oldest.get(kind),
                paused=kind in paused,
                oldest_running=since,
            )
        )
    return Backlog(now, states, backlog, exact=False)
