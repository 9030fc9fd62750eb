"""Indexes for the admin on a big table (docs/operations.md, "Big tables").

- ``intents_created_idx`` on ``(created_at, id)``: the list's default order,
  newest first with ties broken by id (Django adds the primary key to make the
  order total), read from the index instead of sorting every row; intents
  enqueued in one ``enqueue_many`` share their ``created_at``.
- ``intents_kind_state_event_idx`` on ``(kind, state, event_id)`` replaces
  ``(kind, state)``: everything that used the old one still can (the
  summary's counts per kind and state, the kind filter, the list of kinds),
  and a search by event id becomes a few index lookups, one per kind and state.

On PostgreSQL the indexes are built and dropped ``CONCURRENTLY``, so writes go
on while a big table is indexed (this migration is not atomic for that
reason); run inside a transaction, as a test case does, it builds them the
plain way. MySQL and MariaDB build a secondary index online anyway.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

CREATED = models.Index(fields=("created_at", "id"), name="intents_created_idx")
KIND_STATE_EVENT = models.Index(
    fields=("kind", "state", "event_id"), name="intents_kind_state_event_idx"
)
KIND_STATE = models.Index(fields=("kind", "state"), name="intents_kind_state_idx")


def _concurrently(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    connection = schema_editor.connection
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def _add(
    model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor, index: models.Index
) -> None:
    if _concurrently(schema_editor):
        schema_editor.execute(index.create_sql(model, schema_editor, concurrently=True))
    else:
        schema_editor.add_index(model, index)


def _remove(
    model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor, index: models.Index
) -> None:
    if _concurrently(schema_editor):
        name = schema_editor.quote_name(index.name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    else:
        schema_editor.remove_index(model, index)


def forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    model = apps.get_model("django_intents", "Intent")
    _add(model, schema_editor, CREATED)
    _add(model, schema_editor, KIND_STATE_EVENT)
    _remove(model, schema_editor, KIND_STATE)


def backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    model = apps.get_model("django_intents", "Intent")
    _add(model, schema_editor, KIND_STATE)
    _remove(model, schema_editor, KIND_STATE_EVENT)
    _remove(model, schema_editor, CREATED)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("django_intents", "0008_trace_context")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="intent", index=CREATED),
                migrations.AddIndex(model_name="intent", index=KIND_STATE_EVENT),
                migrations.RemoveIndex(model_name="intent", name="intents_kind_state_idx"),
            ],
            database_operations=[migrations.RunPython(forward, backward, elidable=False)],
        ),
    ]
