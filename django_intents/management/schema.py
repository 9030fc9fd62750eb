"""Is the intents table there? The question a command asks before it does anything else.

A pool started before ``migrate`` would otherwise spend its whole
``DB_ERROR_TIMEOUT`` reconnecting on "no such table" errors, and a health
probe would end in a traceback: a missing table is a set-up step not taken,
not an outage, so commands refuse at once and name the step.

Looking must not create anything. Django's SQLite backend creates a missing
database file on connect, which would leave an empty database behind for the
next command to trip on. So a database kept in a file (a backend that can
also keep one in memory says so with ``is_in_memory_db``) whose file is
missing is reported without connecting. Removing the file afterwards instead
would race a ``migrate`` started at the same moment, which may already have
opened that same new file: its tables would go with it.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.models import Intent


def require_table(using: str | None = None) -> None:
    """Raise ``CommandError`` naming ``migrate`` if the intents table is missing.

    ``using`` defaults to the database the backlog is read from. Database
    errors (an unreachable server) propagate: they are an outage, which the
    caller handles as it handles any other.
    """
    using = using or router.db_for_read(Intent)
    connection = connections[using]
    table = Intent._meta.db_table
    missing = missing_file(connection)
    if missing is not None:
        where = f"database file {missing} not found"
    elif table not in connection.introspection.table_names():
        where = f"no table {table!r} in database {using!r}"
    else:
        return
    database = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
    raise CommandError(
        f"the intents table does not exist: run `manage.py migrate{database}` ({where})"
    )


def missing_file(connection: BaseDatabaseWrapper) -> Path | None:
    """The database file that connecting would create, when ``NAME`` names a missing one.

    A missing directory is left to the connection, which then fails like an
    unreachable server: ``migrate`` could not create the file there either.
    """
    in_memory = getattr(connection, "is_in_memory_db", None)
    name = str(connection.settings_dict.get("NAME") or "")
    if in_memory is None or in_memory() or not name or name.startswith("file:"):
        return None
    path = Path(name)
    if path.exists() or not path.parent.is_dir():
        return None
    return path.resolve()
