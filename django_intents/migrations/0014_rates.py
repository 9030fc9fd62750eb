"""``TargetStart``: the recent starts of kinds with a ``rate`` (SPEC §14), one row per claim.

Small: the claims of a rated kind prune the rows that left the longest
window. On MySQL and MariaDB the ``kind`` column gets the binary NO PAD
collation of migration 0004, as in 0012.
"""

from django.db import migrations, models

from django_intents.migrations._mysql import binary_kind


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0013_redrive")]

    operations = [
        migrations.CreateModel(
            name="TargetStart",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("target_key", models.CharField(max_length=64)),
                ("kind", models.CharField(max_length=100)),
                ("target", models.CharField(max_length=2048)),
                ("started_at", models.DateTimeField()),
            ],
            options={
                "indexes": [models.Index(fields=["kind", "started_at"], name="intents_starts_kind_at")],
            },
        ),
        # Not in a transaction: MySQL refuses DDL inside one (as in 0006).
        migrations.RunPython(binary_kind("TargetStart"), migrations.RunPython.noop, atomic=False, elidable=False),
    ]
