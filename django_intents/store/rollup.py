"""The rollup's one write: add a flush's counts to the rows of their minutes, in one statement.

Several pools flush the same minute, so a flush must add to what is there,
never overwrite it: the named statement ``rollup_add`` (``sql/*.sql``) is an
``INSERT`` whose conflict on ``(minute, kind)`` adds the counts, which the
database does under the row's lock, so two pools flushing at the same
instant both count, without a read before the write. Django's
``bulk_create`` with ``update_conflicts`` can only overwrite, hence the SQL.

The longest attempt keeps the greater of the two; a queue depth is a sample,
not a count: the newest sample wins, and a flush without one (``None``) keeps
the row's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.store import backend_for
from django_intents.store.statements import bind

if TYPE_CHECKING:
    from django.db.models import Model


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


def upsert(connection: BaseDatabaseWrapper, model: type[Model], rows: Sequence[RollupRow]) -> None:
    """Add ``rows`` to the rollup table of ``model``'s app, in one statement."""
    if not rows:
        return
    adapt = connection.ops.adapt_datetimefield_value
    values = [(adapt(row.minute), *astuple(row)[1:]) for row in rows]
    statement = backend_for(connection, model).sql.rollup_add
    sql, params = bind(statement, {"rows": values})
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
