"""``TargetState.held_at`` and ``paced_until``: the pace a hold teaches its target (SPEC §14).

Two nullable columns and an index on the second: the claims read the paced
targets by it. Nothing to fill in: a row held before this migration
teaches no pace, and the next hold does.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0016_health")]

    operations = [
        migrations.AddField(
            model_name="targetstate",
            name="held_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="targetstate",
            name="paced_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="targetstate",
            index=models.Index(fields=["paced_until"], name="intents_targets_paced"),
        ),
    ]
