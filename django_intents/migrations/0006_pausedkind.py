"""``PausedKind``: the kinds no claim takes until they are resumed (SPEC §11).

On MySQL and MariaDB the key gets the binary NO PAD collation of the intent
table's ``kind`` (migration 0004), so that a claim compares the two columns
byte for byte: ``"job "`` paused does not pause ``"job"``. Its 100 characters
are at most 400 bytes in utf8mb4, well within InnoDB's index key limit (767
bytes even in the old COMPACT row format), so the key needs no prefix.
"""

from django.db import migrations, models

from django_intents.migrations._mysql import binary_kind


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0005_snoozes")]
    operations = [
        migrations.CreateModel(
            name="PausedKind",
            fields=[
                (
                    "kind",
                    models.CharField(max_length=100, primary_key=True, serialize=False),
                ),
                ("paused_at", models.DateTimeField()),
            ],
            options={"ordering": ("kind",)},
        ),
        # The table goes away with the model when reversed: nothing to undo. Not
        # in a transaction: MySQL refuses DDL inside one (as in 0004).
        migrations.RunPython(
            binary_kind("PausedKind"), migrations.RunPython.noop, atomic=False, elidable=False
        ),
    ]
