"""``TargetState``: one row per (kind, target) that is held, open, half-open or failing (SPEC §14).

A small table, shared by every pool on the database: a row appears when a
target first fails or is held and goes away when it is healthy again. On
MySQL and MariaDB the ``kind`` column gets the binary NO PAD collation of
migration 0004, so that ``"Job"`` and ``"job"`` stay two kinds.
"""

from django.db import migrations, models

from django_intents.migrations._mysql import binary_kind


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0011_last_traceback")]

    operations = [
        migrations.CreateModel(
            name="TargetState",
            fields=[
                ("key", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("kind", models.CharField(max_length=100)),
                ("target", models.CharField(max_length=2048)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("closed", "closed"),
                            ("held", "held"),
                            ("open", "open"),
                            ("half_open", "half-open"),
                        ],
                        default="closed",
                        max_length=9,
                    ),
                ),
                ("failures", models.PositiveIntegerField(default=0)),
                ("openings", models.PositiveIntegerField(default=0)),
                ("until", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "ordering": ("kind", "target"),
                "indexes": [models.Index(fields=["kind", "state"], name="intents_targets_kind_state")],
            },
        ),
        # Not in a transaction: MySQL refuses DDL inside one (as in 0006).
        migrations.RunPython(binary_kind("TargetState"), migrations.RunPython.noop, atomic=False, elidable=False),
    ]
