"""``Rollup``: per kind and minute, what the pools did and how deep the queue was.

The admin's dashboard draws its charts from these rows (``observability/rollup.py``
writes them), never from the intents table. On MySQL and MariaDB the ``kind``
column gets the intent table's binary NO PAD collation (migration 0004), so
that ``"Job"`` and ``"job"`` are two rows, as they are two kinds.
"""

from django.db import migrations, models

from django_intents.migrations._mysql import binary_kind


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0009_admin_indexes")]

    operations = [
        migrations.CreateModel(
            "Rollup",
            [
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("minute", models.DateTimeField()),
                ("kind", models.CharField(max_length=100)),
                ("completed", models.PositiveIntegerField(default=0)),
                ("failed", models.PositiveIntegerField(default=0)),
                ("snoozed", models.PositiveIntegerField(default=0)),
                ("cancelled", models.PositiveIntegerField(default=0)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("duration_sum", models.FloatField(default=0.0)),
                ("duration_max", models.FloatField(default=0.0)),
                ("due", models.PositiveIntegerField(null=True)),
                ("running", models.PositiveIntegerField(null=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("minute", "kind"), name="intents_rollup_minute_kind"
                    )
                ],
            },
        ),
        # The table goes away with the model when reversed: nothing to undo. Not
        # in a transaction: MySQL refuses DDL inside one (as in 0006).
        migrations.RunPython(binary_kind("Rollup"), migrations.RunPython.noop, atomic=False, elidable=False),
    ]
