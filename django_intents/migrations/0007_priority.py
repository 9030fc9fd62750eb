"""``priority``: higher runs first among due intents (SPEC §11).

The claim now walks up to three ranges (``backends/claims.py``): priority 0
on the claim index, which gains a trailing ``priority`` so that the walk
steps over other priorities in the index without reading their rows, and
priorities above and below 0 on a new, usually small, partial index.

MySQL and MariaDB have no partial indexes and 0003 dropped the full copies
Django made of the partial ones there, so the index changes are written per
vendor: the state-led claim index of 0002 gains ``priority`` too, and one
prioritized index, led by a virtual column that is the state for other
priorities and NULL for priority 0, serves both other branches (``priority DESC`` needs MariaDB 10.8
or MySQL 8; older servers accept it and sort the few prioritized rows).

Rebuilding the claim index takes a lock that blocks writes while it builds:
on a table of millions of rows, run this migration in a quiet moment
(docs/operations.md, "Upgrades").
"""

from typing import Any

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

ACTIVE = models.Q(("state", "pending"), ("state", "running"), _connector="OR")
OLD_CLAIMABLE = models.Index(
    condition=ACTIVE, fields=["next_at", "created_at", "id"], name="intents_claimable_idx"
)
CLAIMABLE = models.Index(
    condition=ACTIVE, fields=["next_at", "created_at", "id", "priority"], name="intents_claimable_idx"
)
HIGH = models.Index(
    condition=models.Q(ACTIVE, ("priority__gt", 0)),
    fields=["-priority", "next_at", "created_at", "id"],
    name="intents_high_priority_idx",
)
LOW = models.Index(
    condition=models.Q(ACTIVE, ("priority__lt", 0)),
    fields=["-priority", "next_at", "created_at", "id"],
    name="intents_low_priority_idx",
)
MYSQL_OLD = {"intents_claim_mysql_idx": "(state, next_at, created_at, id)"}
MYSQL_NEW = {
    "intents_claim_mysql_idx": "(state, next_at, created_at, id, priority)",
    "intents_prioritized_mysql_idx": (
        "(prioritized_state, priority DESC, next_at, created_at, id)"
    ),
}
# MySQL and MariaDB: the state of an intent of another priority than 0, NULL for
# priority 0, so that the prioritized index is not rewritten by every transition
# of an intent of priority 0 (InnoDB leaves an entry whose values did not change).
PRIORITIZED_STATE = (
    "prioritized_state varchar(9) AS (CASE WHEN priority <> 0 THEN state END) VIRTUAL"
)


def _mysql(
    schema_editor: BaseDatabaseSchemaEditor, table: str, drop: dict[str, str], create: dict[str, str]
) -> None:
    q = schema_editor.quote_name
    for name in drop:
        schema_editor.execute(f"DROP INDEX {q(name)} ON {table}")
    for name, columns in create.items():
        schema_editor.execute(f"CREATE INDEX {q(name)} ON {table} {columns}")


def _swap(apps: Apps, schema_editor: BaseDatabaseSchemaEditor, forward: bool) -> None:
    model: Any = apps.get_model("django_intents", "Intent")
    if schema_editor.connection.vendor == "mysql":
        table = schema_editor.quote_name(model._meta.db_table)
        if forward:
            schema_editor.execute(f"ALTER TABLE {table} ADD COLUMN {PRIORITIZED_STATE}")
            _mysql(schema_editor, table, MYSQL_OLD, MYSQL_NEW)
        else:
            _mysql(schema_editor, table, MYSQL_NEW, MYSQL_OLD)
            schema_editor.execute(f"ALTER TABLE {table} DROP COLUMN prioritized_state")
        return
    old, new = [OLD_CLAIMABLE], [CLAIMABLE, HIGH, LOW]
    if not forward:
        old, new = new, old
    for index in old:
        schema_editor.remove_index(model, index)
    for index in new:
        schema_editor.add_index(model, index)



def forwards(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _swap(apps, schema_editor, forward=True)


def backwards(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _swap(apps, schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0006_pausedkind")]

    operations = [
        migrations.AlterModelOptions(
            name="intent",
            options={"ordering": ("-priority", "next_at", "created_at", "id")},
        ),
        migrations.AddField(
            model_name="intent",
            name="priority",
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddConstraint(
            model_name="intent",
            constraint=models.CheckConstraint(
                condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                name="intents_priority_range",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="intent", name="intents_claimable_idx"),
                migrations.AddIndex(model_name="intent", index=CLAIMABLE),
                migrations.AddIndex(model_name="intent", index=HIGH),
                migrations.AddIndex(model_name="intent", index=LOW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
