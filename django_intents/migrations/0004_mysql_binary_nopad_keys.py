"""MySQL/MariaDB: compare ids, kinds and claim tokens byte for byte, trailing spaces included.

A column's collation decides equality there. The server default is
case-insensitive (``"Order-1"`` is ``"order-1"``), and even ``utf8mb4_bin``
is a PAD SPACE collation (``"order-1 "`` is ``"order-1"``). With either, a
custom id that differs from another only that way was taken as a duplicate and
its intent silently not recorded, ``kinds=["job "]`` claimed intents of kind
``job``, and a claim token followed by spaces passed the fence. PostgreSQL and
SQLite compare exactly; this gives these three columns the binary NO PAD
collation so that MySQL and MariaDB do too, whatever the database's default:
``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.

Existing rows are kept. On a database whose old collation folded case, two
ids that were one are now two: nothing that was stored changes, only what a
later enqueue or claim matches.
"""

from collections.abc import Callable
from typing import Any

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

COLUMNS = {"id": 64, "kind": 100, "claim_token": 32}


def _collation(connection: Any) -> str:  # MySQL's DatabaseWrapper: mysql_is_mariadb
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def _alter(
    apps: Apps,
    schema_editor: BaseDatabaseSchemaEditor,
    collation: Callable[[Any], str] | None,
) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    model = apps.get_model("django_intents", "Intent")
    table = schema_editor.quote_name(model._meta.db_table)
    for column, length in COLUMNS.items():
        # Without a collation the column takes the table's default again.
        collate = f" CHARACTER SET utf8mb4 COLLATE {collation(connection)}" if collation else ""
        schema_editor.execute(
            f"ALTER TABLE {table} MODIFY {schema_editor.quote_name(column)} "
            f"varchar({length}){collate} NOT NULL"
        )


def binary(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _alter(apps, schema_editor, _collation)


def database_default(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _alter(apps, schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0003_drop_unused_indexes")]
    atomic = False
    operations = [migrations.RunPython(binary, database_default, atomic=False, elidable=False)]
