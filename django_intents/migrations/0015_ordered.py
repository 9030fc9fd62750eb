"""The ordered index: an intent's older siblings of its kind and target that still wait (SPEC §14).

An ordered kind's intent starts only when no intent of its kind and target
created before it is pending or running. A claim asks that of each head it
finds the head of its target (the statement ``ordered_heads``), and this
index answers each in one lookup: the active intents by target, kind and
creation. Like the claim's
indexes it holds only pending and running rows, so it does not grow with the
finished ones. It leads with the target, which no other statement asks
for alone: led by the kind, PostgreSQL counted the live leases of a limited
kind on it, reading every pending intent of the kind, instead of on the
lease index.

Written per database, and kept out of the model's state as MySQL's indexes
of 0002 and 0007 are, for a target may be 2,048 characters: SQLite indexes
it whole; PostgreSQL indexes ``md5(target)``, as a B-tree entry holds at
most 2,704 bytes and a target of many-byte characters is longer; MySQL and
MariaDB (no partial indexes, no expressions in MariaDB's keys, keys of at
most 3,072 bytes) an index on a virtual column, the target's MD5, then the
kind and the state
(a prefix of the target would not keep the index's order by creation, and
each lookup would sort the target's backlog).

On PostgreSQL the index is built and dropped ``CONCURRENTLY``, so writes go
on while a big table is indexed (as in 0009; inside a transaction, as a test
case runs it, the plain way); MySQL and MariaDB build a secondary index
online; SQLite blocks writes while it builds.
"""

from typing import Any

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

ACTIVE = "(state = 'pending' OR state = 'running')"
COLUMNS = {
    "sqlite": ("intents_ordered_idx", "(target, kind, created_at, id)", f" WHERE {ACTIVE}"),
    "postgresql": ("intents_ordered_idx", "(md5(target), kind, created_at, id)", f" WHERE {ACTIVE}"),
    "mysql": ("intents_ordered_mysql_idx", "(target_md5, kind, state, created_at)", ""),
}
# MySQL and MariaDB: the target's MD5, computed when read, stored only in the index.
TARGET_MD5 = "target_md5 binary(16) AS (UNHEX(MD5(target))) VIRTUAL"


def _table(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> str:
    model: Any = apps.get_model("django_intents", "Intent")
    return schema_editor.quote_name(model._meta.db_table)


def _concurrently(schema_editor: BaseDatabaseSchemaEditor) -> str:
    connection = schema_editor.connection
    return " CONCURRENTLY" if connection.vendor == "postgresql" and not connection.in_atomic_block else ""


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    name, columns, where = COLUMNS[schema_editor.connection.vendor]
    table = _table(apps, schema_editor)
    how = _concurrently(schema_editor)
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"ALTER TABLE {table} ADD COLUMN {TARGET_MD5}")
    schema_editor.execute(f"CREATE INDEX{how} {schema_editor.quote_name(name)} ON {table} {columns}{where}")


def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    name, _, _ = COLUMNS[schema_editor.connection.vendor]
    on = f" ON {_table(apps, schema_editor)}" if schema_editor.connection.vendor == "mysql" else ""
    how = _concurrently(schema_editor)
    schema_editor.execute(f"DROP INDEX{how} {schema_editor.quote_name(name)}{on}")
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"ALTER TABLE {_table(apps, schema_editor)} DROP COLUMN target_md5")


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0014_rates")]
    atomic = False
    operations = [migrations.RunPython(create, drop, atomic=False, elidable=False)]
