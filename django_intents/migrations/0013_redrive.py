"""``written_off``: the attempts of an intent that a redrive wrote off (SPEC §14).

``MAX_ATTEMPTS`` and the backoff count ``attempts - snoozes - written_off``:
a redrive sets ``written_off`` to the attempts that counted so far, which
gives a cancelled intent a fresh budget while ``attempts`` keeps its history.
Existing rows start at 0: nothing was written off. The column has a database
default of 0, so processes of the previous release (which do not name it) can
still insert while a deployment rolls out; they do not know the column, so
redrive only once every pool runs this release (docs/operations.md).
Reversing drops the column: a redriven intent's written-off attempts count again.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0012_targets")]
    operations = [
        migrations.AddField(
            model_name="intent",
            name="written_off",
            field=models.PositiveIntegerField(default=0, db_default=0),
        ),
    ]
