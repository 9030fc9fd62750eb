"""The rows of ``TargetState``: read, held by hand, closed, counted (SPEC §14).

One row per (kind, target) that is not plainly healthy, keyed by
``rules.targets.target_key``. What an operator does (``open_target``,
``close_target``, the admin's Targets page) and what the gauges read run at
an operator's or a scraper's pace, so they are the ORM's, not named SQL; a
change locks the row first, so the state it reports as ``previous`` is the
one it replaced, whoever else writes the row (another admin, a pool's claim).

The store sits below the models: the table is found through the app
registry, as ``clock.py`` finds ``Intent``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.apps import apps
from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import Count, Q, QuerySet

from django_intents.rules.targets import TargetHealth, TargetRow, target_key

# The rows that are not plainly healthy: held, open, half-open, or closed but failing.
# A row that is none of these (closed, no failures) is one a writer is about to delete.
UNHEALTHY = ~Q(state=TargetHealth.CLOSED.value) | Q(failures__gt=0)
# Tries of a change that the database refused as a deadlock's victim (``_retried``).
TRIES = 5
# What a deadlock's victim is told: MySQL's error 1213, PostgreSQL's SQLSTATE 40P01.
MYSQL_DEADLOCK = 1213
POSTGRESQL_DEADLOCK = "40P01"

_T = TypeVar("_T")


def table(alias: str) -> QuerySet[Any]:
    """``TargetState`` on ``alias``, unordered."""
    return apps.get_model("django_intents", "TargetState")._default_manager.using(alias).order_by()


def read_target_rows(
    alias: str,
    *,
    now: datetime,
    kind: str | None = None,
    state: str | None = None,
    limit: int | None = None,
) -> list[TargetRow]:
    """Every target that is not plainly healthy (the first ``limit``), by (kind, target);
    one query."""
    rows = table(alias).filter(UNHEALTHY)
    if kind is not None:
        rows = rows.filter(kind=kind)
    if state is not None:
        rows = rows.filter(state=state)
    fields = ("kind", "target", "state", "failures", "until", "last_error")
    found = rows.order_by("kind", "target").values_list(*fields)
    return [
        TargetRow.at(now, **dict(zip(fields, values, strict=True)))
        for values in (found if limit is None else found[:limit])
    ]


def hold_target_row(
    alias: str, kind: str, target: str, *, until: datetime, now: datetime
) -> TargetHealth | None:
    """Hold (kind, target) until ``until``; the state it had, or ``None`` if already so held.

    Its count of failures and of openings stay: a hold by hand is not a
    verdict on the target, so a breaker that was open reopens as it would have.
    A pace a handler's hold taught is forgotten: the operator's hold replaces it.
    """
    return _retried(alias, lambda: _hold(alias, kind, target, until, now))


def _hold(
    alias: str, kind: str, target: str, until: datetime, now: datetime
) -> TargetHealth | None:
    key = target_key(kind, target)
    with transaction.atomic(using=alias):
        row = _locked(alias, key)
        while row is None:
            try:
                with transaction.atomic(using=alias):  # a savepoint: a racing insert may win
                    table(alias).create(
                        key=key,
                        kind=kind,
                        target=target,
                        state=TargetHealth.HELD.value,
                        until=until,
                        updated_at=now,
                    )
                return TargetHealth.CLOSED
            except IntegrityError:
                row = _locked(alias, key)  # None again if it was closed meanwhile
        previous = TargetHealth(row.state)
        if previous is TargetHealth.HELD and row.until == until:
            return None
        table(alias).filter(key=key).update(
            state=TargetHealth.HELD.value,
            until=until,
            held_at=None,
            paced_until=None,
            updated_at=now,
        )
        return previous


def _locked(alias: str, key: str) -> Any:
    """The row of ``key``, locked until the transaction ends; ``None`` if there is none."""
    return table(alias).select_for_update().filter(key=key).first()


def _retried(alias: str, change: Callable[[], _T]) -> _T:
    """``change()``, run again when the database chose it as a deadlock's victim.

    Where there is no row yet, MySQL's locking read locks the gap where it
    would go, and two holds of one new target at the same instant (pools that
    all met the partner's 429) each wait for the other's insert: InnoDB rolls
    one back. That whole transaction is gone, so it is tried again, up to
    ``TRIES`` times, but only when it is this function's own: inside a
    caller's transaction the error is the caller's, as any other would be.
    """
    if not connections[alias].in_atomic_block:
        for _ in range(TRIES - 1):
            try:
                return change()
            except OperationalError as exc:
                if not _deadlock(exc):
                    raise
    return change()


def _deadlock(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return (
        exc.args[:1] == (MYSQL_DEADLOCK,) or getattr(cause, "sqlstate", None) == POSTGRESQL_DEADLOCK
    )


def close_target_row(alias: str, kind: str, target: str) -> TargetHealth | None:
    """Delete the row of (kind, target): healthy, counts and cooldown reset; the state it
    had, or ``None`` when it had no row."""
    key = target_key(kind, target)
    with transaction.atomic(using=alias):
        row = _locked(alias, key)
        if row is None:
            return None
        table(alias).filter(key=key).delete()
        return TargetHealth(row.state)


def count_target_rows(alias: str) -> dict[tuple[str, str], int]:
    """How many targets are in each state, per kind: one grouped query along the
    ``(kind, state)`` index. Closed rows count only while they are failing."""
    grouped = table(alias).filter(UNHEALTHY).values_list("kind", "state").annotate(n=Count("pk"))
    return {(kind, state): n for kind, state, n in grouped}
