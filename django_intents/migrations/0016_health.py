"""Held targets and the circuit breaker (SPEC §14): the probe of a half-open target, and
the indexes the claims find the blocking targets by.

SQLite and MySQL look each intent a claim walks up in ``TargetState`` by
``(kind, target)`` (``target_open`` in ``store/sql/common.sql``): an index
on both, which finds nothing at once in the common empty table. MySQL caps
an index key at 3,072 bytes, less than a 2,048-character target takes in
utf8mb4, so its index keeps the first 255 characters of the target (a
prefix index; the lookup compares the whole value on the rows it finds).
PostgreSQL reads the blocking rows once per statement as a hashed set
(``held_targets`` in ``postgresql.sql``) through the index on ``(state,
until)``, which every database gets: the watch and the sweep read by state
too. No index on ``(kind, target)`` there: a B-tree entry is capped at a
third of a page, which the longest targets exceed.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

INDEX = "intents_targets_kind_target"


def kind_target_index(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor not in ("sqlite", "mysql"):
        return
    table = connection.ops.quote_name(apps.get_model("django_intents", "TargetState")._meta.db_table)
    target = "target(255)" if connection.vendor == "mysql" else "target"
    schema_editor.execute(f"CREATE INDEX {INDEX} ON {table} (kind, {target})")


def drop_kind_target_index(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    table = connection.ops.quote_name(apps.get_model("django_intents", "TargetState")._meta.db_table)
    if connection.vendor == "sqlite":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")
    elif connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {INDEX} ON {table}")


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0015_ordered")]

    operations = [
        migrations.AddField(
            model_name="targetstate",
            name="probe",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddIndex(
            model_name="targetstate",
            index=models.Index(fields=["state", "until"], name="intents_targets_state_until"),
        ),
        # Not in a transaction: MySQL refuses DDL inside one (as in 0006).
        migrations.RunPython(
            kind_target_index, drop_kind_target_index, atomic=False, elidable=False
        ),
    ]
