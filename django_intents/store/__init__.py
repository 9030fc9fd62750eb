"""The SQL of django-intents behind one interface (``base.Backend``): a module per
database, and its named statements in ``sql/<vendor>.sql`` (``statements.py``).

``backend_for`` picks the module by the connection's vendor: no module
outside the store asks which database it is. What the pool needs to know of
its database the backend says (``claims_skip_locked``, ``wakeup``), and a
pool's claims remember what they learn in the pool's own ``ClaimMemory``.
Modules are imported by name, as Django loads its own database backends, so
a project without psycopg or mysqlclient never imports them.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import NotSupportedError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.module_loading import import_string

from django_intents.store.base import NOTIFY_CHANNEL, Backend
from django_intents.store.claims import ClaimFilters
from django_intents.store.memory import ClaimMemory
from django_intents.store.statements import standalone

if TYPE_CHECKING:
    from django.db.models import Model

BACKENDS = {
    "postgresql": "django_intents.store.postgresql.backend.PostgreSQLBackend",
    "sqlite": "django_intents.store.sqlite.SQLiteBackend",
    "mysql": "django_intents.store.mysql.MySQLBackend",
}

__all__ = ["NOTIFY_CHANNEL", "Backend", "ClaimFilters", "ClaimMemory", "backend_for", "read_clock"]


def backend_for(connection: BaseDatabaseWrapper, model: type[Model]) -> Backend:
    """The backend for ``connection``'s database, built once per alias and model."""
    return _backend(connection.vendor, connection.alias, model)


@functools.cache
def _backend(vendor: str, alias: str, model: type[Model]) -> Backend:
    backend: Backend = _backend_class(vendor, alias)(alias, model)
    return backend


def _backend_class(vendor: str, alias: str) -> type[Backend]:
    try:
        path = BACKENDS[vendor]
    except KeyError:
        raise NotSupportedError(
            f"django-intents supports {', '.join(sorted(BACKENDS))}, not {vendor!r} "
            f"(database {alias!r})"
        ) from None
    backend_class: type[Backend] = import_string(path)
    return backend_class


def read_clock(connection: BaseDatabaseWrapper) -> datetime | None:
    """The database server's time now, aware, in UTC (``clock.py`` carries it forward).

    ``None`` for a database without a clock of its own (SQLite, in-process).
    """
    _backend_class(connection.vendor, connection.alias)  # refuses a database not supported
    sql = standalone(connection.vendor, "clock")
    if sql is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value: datetime = cursor.fetchone()[0]
    return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value.astimezone(UTC)


def partial_indexes_served(connection: BaseDatabaseWrapper) -> bool:
    """Whether every partial index of the model has a working counterpart on ``connection``.

    Where the database has no partial indexes (MySQL, MariaDB), migrations
    0002 and 0007 add full indexes led by the state in their place.
    """
    return bool(connection.features.supports_partial_indexes) or connection.vendor == "mysql"
