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

from django.db import migrations

MYSQL_COLUMNS = {
    "intents_claimable_idx": "(next_at, created_at, id)",
    "intents_lease_idx": "(claim_until)",
    "intents_finished_idx": "(updated_at)",
}


def _table(apps, schema_editor):
    model = apps.get_model("django_intents", "Intent")
    return model, schema_editor.quote_name(model._meta.db_table)


def _like_name(model, schema_editor):
    column = model._meta.get_field("id").column
    return schema_editor._create_index_name(model._meta.db_table, [column], suffix="_like")


def drop(apps, schema_editor):
    model, table = _table(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        name = schema_editor.quote_name(_like_name(model, schema_editor))
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
    elif vendor == "mysql":
        for name in MYSQL_COLUMNS:
            schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)} ON {table}")


def create(apps, schema_editor):
    model, table = _table(apps, schema_editor)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        name = schema_editor.quote_name(_like_name(model, schema_editor))
        column = schema_editor.quote_name(model._meta.get_field("id").column)
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
