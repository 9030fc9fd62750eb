"""Claim indexes for MySQL and MariaDB, which have no partial indexes.

On those databases Django skips the partial indexes of 0001, so the claim
would scan completed rows. These full indexes lead with ``state``, which keeps
the claim an ordered range scan over claimable rows only. Other databases
already have the partial indexes and get nothing here.
"""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

INDEXES = {
    "intents_claim_mysql_idx": "(state, next_at, created_at, id)",
    "intents_lease_mysql_idx": "(state, claim_until)",
    "intents_finished_mysql_idx": "(state, updated_at)",
}


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name(apps.get_model("django_intents", "Intent")._meta.db_table)
    for name, columns in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX {schema_editor.quote_name(name)} ON {table} {columns}")


def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    table = schema_editor.quote_name(apps.get_model("django_intents", "Intent")._meta.db_table)
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)} ON {table}")


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0001_initial")]
    atomic = False
    operations = [migrations.RunPython(create, drop, atomic=False, elidable=False)]
