"""The rollup's one write: add a flush's counts to the rows of their minutes, in one statement.

Several pools flush the same minute, so a flush must add to what is there,
never overwrite it: an ``INSERT`` whose conflict on ``(minute, kind)`` turns
into ``count = count + new`` (``ON CONFLICT ... DO UPDATE`` on PostgreSQL and
SQLite, ``ON DUPLICATE KEY UPDATE`` on MySQL and MariaDB). The database does
the adding under the row's lock, so two pools flushing at the same instant
both count, without a read before the write. Django's ``bulk_create`` with
``update_conflicts`` can only overwrite, hence the SQL here.

The longest attempt keeps the greater of the two; a queue depth is a sample,
not a count: the newest sample wins, and a flush without one (``None``) keeps
the row's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

ADDED = ("completed", "failed", "snoozed", "cancelled", "attempts", "duration_sum")
LARGEST = ("duration_max",)
SAMPLED = ("due", "running")


@dataclass
class RollupRow:
    """One kind's minute, as one flush adds it (the columns of ``models.Rollup``)."""

    minute: datetime
    kind: str
    completed: int = 0
    failed: int = 0
    snoozed: int = 0
    cancelled: int = 0
    attempts: int = 0
    duration_sum: float = 0.0
    duration_max: float = 0.0
    due: int | None = None
    running: int | None = None


COLUMNS = ("minute", "kind", *ADDED, *LARGEST, *SAMPLED)


def upsert(connection: BaseDatabaseWrapper, table: str, rows: Sequence[RollupRow]) -> None:
    """Add ``rows`` to ``table`` (``models.Rollup``'s) in one statement."""
    if not rows:
        return
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column) for column in COLUMNS)
    values = ", ".join(["(" + ", ".join(["%s"] * len(COLUMNS)) + ")"] * len(rows))
    params: list[Any] = []
    for row in rows:
        fields = list(astuple(row))
        fields[0] = connection.ops.adapt_datetimefield_value(row.minute)
        params.extend(fields)
    conflict = _on_conflict(connection, table)
    sql = f"INSERT INTO {quote(table)} ({columns}) VALUES {values} {conflict}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _on_conflict(connection: BaseDatabaseWrapper, table: str) -> str:
    quote = connection.ops.quote_name
    if connection.vendor == "mysql":

        def old(column: str) -> str:
            return quote(column)

        def new(column: str) -> str:
            return f"VALUES({quote(column)})"

        greatest = "GREATEST"
        clause = "ON DUPLICATE KEY UPDATE"
    else:  # PostgreSQL and SQLite spell it the same way, bar the greater of two

        def old(column: str) -> str:
            return f"{quote(table)}.{quote(column)}"

        def new(column: str) -> str:
            return f"EXCLUDED.{quote(column)}"

        greatest = "MAX" if connection.vendor == "sqlite" else "GREATEST"
        clause = f"ON CONFLICT ({quote('minute')}, {quote('kind')}) DO UPDATE SET"
    sets = [f"{quote(c)} = {old(c)} + {new(c)}" for c in ADDED]
    sets += [f"{quote(c)} = {greatest}({old(c)}, {new(c)})" for c in LARGEST]
    sets += [f"{quote(c)} = COALESCE({new(c)}, {old(c)})" for c in SAMPLED]
    return f"{clause} {', '.join(sets)}"
