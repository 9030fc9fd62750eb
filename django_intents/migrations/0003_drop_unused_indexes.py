"""Drop indexes that every write paid for and no query used.

PostgreSQL: Django gives an indexed ``CharField`` a second, ``varchar_pattern_ops``
index (``..._like``) so that ``LIKE 'prefix%'`` can use an index. Nothing asks
that of ``id``: lookups are by equality, which the primary key serves, and the
admin's id search is case-insensitive, which this index cannot serve either.

MySQL and MariaDB: they have no partial indexes, and Django does not skip a
``condition`` there but creates the index without it. So 0001 left full
indexes on ``(next_at, created_at, id)``, ``(claim_until)`` and
``(updated_at)`` beside the state-led ones of 0002, which are the ones the
claim, the lease check and retention use.

The two vendors had one more index to write on every enqueue and claim
(PostgreSQL) or three more on every transition (MySQL), for nothing.
"""

from typing import Protocol, cast

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

MYSQL_COLUMNS = {
    "intents_claimable_idx": "(next_at, created_at, id)",
    "intents_lease_idx": "(claim_until)",
    "intents_finished_idx": "(updated_at)",
}


def _table(
    apps: Apps, schema_editor: BaseDatabaseSchemaEditor
) -> tuple[type[models.Model], str]:
    model = apps.get_model("django_intents", "Intent")
    return model, schema_editor.quote_name(model._meta.db_table)


class _NamesIndexes(Protocol):
    """The private method of Django's schema editor that named the ``_like`` index:
    the same call gives the same name, which is the only way to know it."""

    def _create_index_name(self, table_name: str, column_names: list[str], suffix: str) -> str: ...


def _like_name(model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor) -> str:
    column = str(model._meta.pk.column)
    names = cast(_NamesIndexes, schema_editor)
    return names._create_index_name(model._meta.db_table, [column], suffix="_like")


def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    model, table = _table(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        name = schema_editor.quote_name(_like_name(model, schema_editor))
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
    elif vendor == "mysql":
        for name in MYSQL_COLUMNS:
            schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)} ON {table}")


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    model, table = _table(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        name = schema_editor.quote_name(_like_name(model, schema_editor))
        column = schema_editor.quote_name(str(model._meta.pk.column))
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({column} varchar_pattern_ops)"
        )
    elif vendor == "mysql":
        for name, columns in MYSQL_COLUMNS.items():
            quoted = schema_editor.quote_name(name)
            schema_editor.execute(f"CREATE INDEX {quoted} ON {table} {columns}")


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0002_mysql_claim_indexes")]
    atomic = False
    operations = [migrations.RunPython(drop, create, atomic=False, elidable=False)]
