"""The intent table of one database alias: its connection, its columns, its named statements.

A plain collaborator that the backend and the helpers it hands work to
(``rows.py``, ``limited.py``) all hold: what they need of the database,
without knowing which backend built it, so that none of them imports another.
Identifiers come from the model's ``_meta`` through ``quote_name``, once,
when the statements are loaded (``statements.py``); values are always
parameters.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.rules.states import CLAIM_ORDER, order_by_sql
from django_intents.store.statements import Statements, bind, load

if TYPE_CHECKING:
    from django.db.models import Model

    from django_intents.store.claims import ClaimFilters

# What the floor of a claim without one is: earlier than any intent's next_at.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)


_PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")
_RESERVED = frozenset({"order", "group", "user", "limit", "offset", "table", "select", "from"})


# PostgreSQL's layout (migration 0018, docs/deployment.md "Storage"): the live
# partition, the day partitions, the ids.
KEYS = "django_intents_key"


def live_partition(app_label: str) -> str:
    return f"{app_label}_live"


def day_partition(app_label: str, day: int) -> str:
    return f"{app_label}_d{day}"


def bare(column: str, quote: Callable[[str], str]) -> str:
    """``column`` as SQL: bare when it is a plain lowercase word no database reserves."""
    return column if _PLAIN.match(column) and column not in _RESERVED else quote(column)


class Table:
    """One database alias's intent table, as raw SQL sees it.

    ``cursor`` makes the cursors its statements run on (PostgreSQL binds
    parameters on the server: ``postgresql/cursors.py``); ``returning`` says
    whether ``UPDATE ... RETURNING`` exists there.
    """

    def __init__(
        self,
        alias: str,
        model: type[Model],
        *,
        vendor: str,
        returning: bool,
        cursor: Callable[[], Any] | None = None,
        values: dict[str, str] | None = None,
    ) -> None:
        self.alias = alias
        self.model = model
        self.returning = returning
        self._cursor = cursor
        q = self.connection.ops.quote_name
        meta = model._meta
        self.name = q(meta.db_table)
        # PostgreSQL keeps live intents in a partition of their own (migration
        # 0018): what the claims and the fenced writes name. Elsewhere: the table.
        self.live = q(live_partition(meta.app_label)) if vendor == "postgresql" else self.name
        self.keys = q(KEYS)
        self.paused = q(meta.apps.get_model(meta.app_label, "PausedKind")._meta.db_table)
        rollup = q(meta.apps.get_model(meta.app_label, "Rollup")._meta.db_table)
        starts = q(meta.apps.get_model(meta.app_label, "TargetStart")._meta.db_table)
        self.target_model = meta.apps.get_model(meta.app_label, "TargetState")
        self.targets = q(self.target_model._meta.db_table)
        self.fields = meta.concrete_fields
        self.columns = tuple(str(field.column) for field in self.fields)
        column_list = ", ".join(q(column) for column in self.columns)
        self.sql: Statements = load(
            vendor,
            {
                "table": self.name,
                "live": self.live,
                "keys": self.keys,
                "paused": self.paused,
                "rollup": rollup,
                "starts": starts,
                "targets": self.targets,
                "key": q("key"),
                "columns": column_list,
                # Bare where quoting changes nothing (the model's columns are plain
                # lowercase words, none reserved): PostgreSQL's limited claims
                # return every column and must fit psycopg's 4,096-byte cache.
                "t_columns": ", ".join("t." + bare(column, q) for column in self.columns),
                "column_group": "(" + ", ".join(["%s"] * len(self.columns)) + ")",
                "claim_order": order_by_sql(CLAIM_ORDER),
                "order_within_priority": order_by_sql(
                    tuple(field for field in CLAIM_ORDER if field.lstrip("-") != "priority")
                ),
                **(values or {}),
            },
        )

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def cursor(self) -> Any:
        return self._cursor() if self._cursor is not None else self.connection.cursor()

    def dt(self, value: datetime) -> Any:
        """A time as this database's driver takes it."""
        return self.connection.ops.adapt_datetimefield_value(value)

    def from_db(self, value: Any) -> datetime:
        """A time a raw row gave back, aware in UTC: SQLite returns text where the
        column's type is lost (an aggregate), MySQL naive UTC, PostgreSQL aware."""
        moment: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    def converter(self, model: type[Model], name: str) -> Callable[[Any], Any]:
        """What the ORM does to a raw value of ``model``'s field ``name`` (a time: aware)."""
        conn, field = self.connection, model._meta.get_field(name)
        col = field.get_col(model._meta.db_table)  # type: ignore[union-attr]
        funcs = conn.ops.get_db_converters(col) + field.get_db_converters(conn)  # type: ignore[union-attr]

        def convert(value: Any) -> Any:
            for func in funcs:
                value = func(value, col, conn)
            return value

        return convert

    def execute(self, cursor: Any, name: str, /, **params: Any) -> Any:
        """Run the statement ``name`` on ``cursor`` with ``params`` (lists expanded
        where the statement has a list of them: ``statements.bind``)."""
        statement, bound = bind(self.sql[name], params)
        cursor.execute(statement, bound)
        return cursor

    def run(self, name: str, /, **params: Any) -> list[Any]:
        """Run the statement ``name`` on a cursor of its own; its rows, if it returns any."""
        with self.cursor() as cursor:
            self.execute(cursor, name, **params)
            return cursor.fetchall() if cursor.description else []

    def count(self, name: str, /, **params: Any) -> int:
        """Run the statement ``name``; how many rows it changed."""
        with self.cursor() as cursor:
            self.execute(cursor, name, **params)
            return int(cursor.rowcount)


def claim_params(
    table: Table, *, now: datetime, filters: ClaimFilters, limit: int | None = None
) -> dict[str, Any]:
    """The parameters of a claim and of a due probe (``due``, ``claim_filters``,
    ``floor`` in the SQL files): every condition is always in the statement, and
    a filter not asked for is given the value that keeps every row."""
    return {
        "now": table.dt(now),
        "every_kind": not filters.kinds,
        "kinds": list(filters.kinds or ()),
        "max_attempts": filters.max_attempts,
        "full_kinds": list(filters.full_kinds),
        "full_targets": list(filters.full_targets),
        "exempt": list(filters.exempt),
        "floor": table.dt(filters.since or EARLIEST),
        "limit": limit,
        # What a claim that updates as it selects (PostgreSQL's) sets; the
        # caller gives them, and an EXPLAIN may go without.
        "salt": None,
        "until": None,
    }
