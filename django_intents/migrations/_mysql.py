"""What the migrations do only on MySQL and MariaDB (Django's loader skips ``_`` modules).

A ``kind`` column that is a key compares bytes there, as on the other
databases, instead of the server's case- and accent-folding collation: the
kinds ``Job`` and ``job`` are two kinds everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.apps.registry import Apps
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

Operation = Callable[[Apps, BaseDatabaseSchemaEditor], None]


def binary_kind(model_name: str) -> Operation:
    """A ``RunPython`` function that makes ``model_name``'s ``kind`` column binary on MySQL."""

    def alter(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        connection: Any = schema_editor.connection  # MySQL's, when it matters
        if connection.vendor != "mysql":
            return
        collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
        table = apps.get_model("django_intents", model_name)._meta.db_table
        schema_editor.execute(
            f"ALTER TABLE {schema_editor.quote_name(table)} MODIFY "
            f"{schema_editor.quote_name('kind')} "
            f"varchar(100) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
        )

    return alter
