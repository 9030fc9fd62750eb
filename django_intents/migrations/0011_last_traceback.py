"""``last_traceback``: the tail of the last failure's traceback, beside ``last_error``.

A text column with a database default: existing rows read as "", no table
rewrite on PostgreSQL 11+, and a process of the previous release, which does
not name the column, still inserts while a deployment rolls out.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0010_rollup")]

    operations = [
        migrations.AddField(
            "intent", "last_traceback", models.TextField(blank=True, default="", db_default="")
        ),
    ]
