"""The SQL behind the admin on a big table: the kinds present, the planner's estimates,
and the administrative transitions on many intents at once.

Each costs what it returns, not what the table holds: the kinds are read from
the ``(kind, state, event_id)`` index one kind at a time, an estimate is the
planner's (no row is read), and a transition on a selection is one statement
per ``rules.batches.INSERT_BATCH`` intents, however many are selected.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from django_intents.rules.batches import INSERT_BATCH
from django_intents.store import backend_for
from django_intents.store.base import Backend


def kinds(backend: Backend) -> list[str]:
    """Every kind in the table, in order: a loose index scan, one index lookup per kind.

    A recursive query, which PostgreSQL, MariaDB/MySQL and SQLite all run the
    same way; ``SELECT DISTINCT kind`` would read every row's index entry.
    """
    return [kind for (kind,) in backend.table.run("kinds")]


def estimate(queryset: QuerySet[Any]) -> int | None:
    """The planner's estimate of how many rows ``queryset`` returns; ``None`` on SQLite,
    whose planner keeps no row counts."""
    found = estimates([queryset])
    return None if found is None else found[0]


def estimates(querysets: Sequence[QuerySet[Any]]) -> list[int] | None:
    """The planner's estimate for each of ``querysets`` (of one database), from one
    ``EXPLAIN`` of them all joined by ``UNION ALL`` (``Backend.estimate_rows``);
    ``None`` on SQLite."""
    first = querysets[0]
    parts: list[str] = []
    params: list[Any] = []
    for queryset in querysets:
        # Only the primary key: the estimate is the same, the plan quicker to make.
        sql, part_params = queryset.order_by().values("pk").query.sql_with_params()
        parts.append(f"({sql})")
        params.extend(part_params)
    backend = backend_for(connections[first.db], first.model)
    return backend.estimate_rows(" UNION ALL ".join(parts), params, len(querysets))


def oldest_due(backend: Backend, kinds: Sequence[str], *, now: datetime) -> dict[str, datetime]:
    """Per kind, when its longest-waiting due intent became claimable: one statement of
    two ``MIN`` subqueries per kind, each of which the planner may answer by walking
    the claim index (or the lease index) in order to the kind's first row."""
    if not kinds:
        return {}
    [found] = backend.table.run(
        "oldest_due", now=backend.dt(now), kinds=[(kind, kind) for kind in kinds]
    )
    oldest = {}
    for kind, times in zip(kinds, zip(found[::2], found[1::2], strict=True), strict=True):
        known = [_aware(value) for value in times if value is not None]
        if known:
            oldest[kind] = min(known)
    return oldest


def _aware(value: datetime) -> datetime:
    """A time from a raw cursor, in UTC: MySQL's come naive (stored in UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def administer_many(
    backend: Backend, name: str, ids: Sequence[str], *, now: datetime
) -> list[tuple[str, str]]:
    """Run the administrative transition ``name`` on the unfinished intents among ``ids``;
    return ``(id, kind)`` of each one it moved.

    One ``UPDATE ... RETURNING`` per batch (``administer``). The batches are
    one transaction: a selection moves whole or not at all.
    """
    at = backend.dt(now)
    moved: list[tuple[str, str]] = []
    with transaction.atomic(using=backend.alias), backend.cursor() as cursor:
        for start in range(0, len(ids), INSERT_BATCH):
            moved += administer(backend, cursor, name, ids[start : start + INSERT_BATCH], at=at)
    return moved


def redrive_batch(backend: Backend, ids: Sequence[str], *, now: datetime) -> list[tuple[str, str]]:
    """Redrive the cancelled intents among ``ids`` (at most ``INSERT_BATCH``) in a
    transaction of their own; return ``(id, kind)`` of each one it moved.

    A redrive may reach every cancelled intent of a table, so each batch
    commits alone: its locks are held for one statement, never across a pass.
    """
    if len(ids) > INSERT_BATCH:
        raise ValueError(f"a redrive batch holds at most {INSERT_BATCH} ids, not {len(ids)}")
    with transaction.atomic(using=backend.alias), backend.cursor() as cursor:
        return administer(backend, cursor, "redrive", ids, at=backend.dt(now))


# The intents each transition may move, locked first where the database cannot
# return from an update; the transitions not named here move unfinished ones.
_LOCK = {"redrive": "administer_select_cancelled"}
# The transitions that make intents due now, which wakes idle pools.
_WAKES = ("retry_now", "redrive")


def administer(
    backend: Backend, cursor: Any, name: str, batch: Sequence[str], *, at: Any
) -> list[tuple[str, str]]:
    """One batch of the transition ``name`` in the caller's transaction.

    MySQL and MariaDB, which cannot return from an update, lock the batch's
    rows the transition may move first and update those. Intents made due
    wake idle pools, as ``retry_now`` does.
    """
    table = backend.table
    if name == "redrive" and "unfinish" in table.sql:  # PostgreSQL: moved out, back first
        table.execute(cursor, "unfinish", ids=list(batch))
    if table.returning:
        rows = table.execute(cursor, f"administer_{name}", now=at, ids=list(batch)).fetchall()
    else:
        lock = _LOCK.get(name, "administer_select")
        rows = table.execute(cursor, lock, ids=list(batch)).fetchall()
        if rows:
            found = [row[0] for row in rows]
            table.execute(cursor, f"administer_{name}", now=at, ids=found)
    if rows and name in _WAKES and "notify_kinds" in table.sql:
        due = sorted({kind for _, kind, _ in rows})
        other = sorted({kind for _, kind, priority in rows if priority})
        table.execute(cursor, "notify_kinds", kinds=due, prioritized=other)
    return [(id, kind) for id, kind, _ in rows]
