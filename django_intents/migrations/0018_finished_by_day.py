"""PostgreSQL: finished intents out of the live table, in a partition per day (issue 38).

``django_intents_intent`` becomes a table partitioned by an integer ``part``
that the model does not know: partition 0, ``django_intents_live``, is the
table as it was (no row is copied); the finished intents move out of it
into a partition per day (``part`` the day's number since 1970,
``django_intents_d<day>``), made as they are needed (there is no default
partition). Django, the admin and every query keep reading one table; the
claims name the live partition.
``django_intents_key`` holds the id of every enqueue and of every intent
that moved out, so that an id stays unique across the partitions, which no
index of PostgreSQL can make sure of (docs/deployment.md, "Storage").

Each step holds a lock that stops the queue for milliseconds at most: the
column and its checks are catalog changes, the checks are validated without
blocking writes, each in a transaction of its own (this migration is not
atomic), and the swap attaches the old table whole, its checks proving that
its rows belong where they are, so nothing is scanned under its lock.
Finished rows move out afterwards, a batch at a time, by the pools and by
``prune_intents``. From the swap on, a process of the previous release can
no longer enqueue (docs/deployment.md says when to stop them). On SQLite
and MariaDB it does nothing: their one table meets their targets.

Reversing it moves every finished row back into the one table.
"""

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

TABLE = "django_intents_intent"
LIVE = "django_intents_live"
KEY = "django_intents_key"
FINISHED = "(state = 'completed' OR state = 'cancelled')"
# The indexes every partition has: the admin's and retention's. The live
# partition keeps its own (the claims', the lease's) and its primary key.
SHARED = {
    "intents_created_idx": ("intents_all_created_idx", "(created_at, id)"),
    "intents_kind_state_event_idx": (
        "intents_all_kind_state_event_idx",
        "(kind, state, event_id)",
    ),
    "intents_finished_idx": ("intents_all_finished_idx", f"(updated_at) WHERE {FINISHED}"),
}


def forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    run = schema_editor.execute
    run(f"ALTER TABLE {TABLE} ADD COLUMN part integer NOT NULL DEFAULT 0")
    run(
        f"ALTER TABLE {TABLE} ADD CONSTRAINT intents_live_part "
        "CHECK (part >= 0 AND part < 1) NOT VALID"
    )
    run(
        f"ALTER TABLE {TABLE} ADD CONSTRAINT intents_finished_out "
        f"CHECK (part = 0 OR {FINISHED}) NOT VALID"
    )
    run(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT intents_live_part")
    run(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT intents_finished_out")
    with schema_editor.connection.cursor() as cursor, _atomic(schema_editor):
        for statement in (
            f"ALTER TABLE {TABLE} RENAME TO {LIVE}",
            f"CREATE TABLE {TABLE} (LIKE {LIVE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            "PARTITION BY RANGE (part)",
            f"ALTER TABLE {TABLE} DROP CONSTRAINT intents_live_part",
            *(f"CREATE INDEX {name} ON ONLY {TABLE} {d}" for name, d in SHARED.values()),
            f"ALTER TABLE {TABLE} ATTACH PARTITION {LIVE} FOR VALUES FROM (0) TO (1)",
            *(f"ALTER INDEX {name} ATTACH PARTITION {own}" for own, (name, _) in SHARED.items()),
            f"CREATE TABLE {KEY} (id varchar(64) PRIMARY KEY)",
        ):
            cursor.execute(statement)


def backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname <> 'part'",
            [LIVE],
        )
        (columns,) = cursor.fetchone()
        with _atomic(schema_editor):
            for statement in (
                f"INSERT INTO {LIVE} ({columns}, part) SELECT {columns}, 0 FROM {TABLE} "
                "WHERE part <> 0",
                f"ALTER TABLE {TABLE} DETACH PARTITION {LIVE}",
                f"DROP TABLE {TABLE}",
                f"ALTER TABLE {LIVE} RENAME TO {TABLE}",
                f"ALTER TABLE {TABLE} DROP CONSTRAINT intents_live_part",
                f"ALTER TABLE {TABLE} DROP CONSTRAINT intents_finished_out",
                f"ALTER TABLE {TABLE} DROP COLUMN part",
                f"DROP TABLE {KEY}",
            ):
                cursor.execute(statement)


def _atomic(schema_editor: BaseDatabaseSchemaEditor):  # type: ignore[no-untyped-def]
    from django.db import transaction

    return transaction.atomic(using=schema_editor.connection.alias)


class Migration(migrations.Migration):
    # Each step commits alone: one transaction would hold the first ALTER's lock
    # through the validations' reads of the whole table.
    atomic = False

    dependencies = [("django_intents", "0017_paces")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
