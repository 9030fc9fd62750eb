"""``snoozes``: the claims of an intent that ended in ``Retry(after=...)``.

``MAX_ATTEMPTS`` and the backoff count ``attempts - snoozes``, so a partner
that asks to be called later (HTTP 429 with ``Retry-After``) never exhausts
an intent. Existing rows start at 0: every attempt they made counts, as it did.
The column has a database default of 0, so processes of the previous release
(which do not name it) can still insert while a deployment rolls out.
Reversing drops the column; the snoozes recorded so far are forgotten.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0004_mysql_binary_nopad_keys")]
    operations = [
        migrations.AddField(
            model_name="intent",
            name="snoozes",
            field=models.PositiveIntegerField(default=0, db_default=0),
        ),
    ]
