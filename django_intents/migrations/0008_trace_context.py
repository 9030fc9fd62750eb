"""``trace_context``: the W3C trace context of the span that enqueued an intent.

Each attempt's span links to it (``tracing.py``, the ``otel`` extra). It is
empty without OpenTelemetry. A ``varchar``, not ``text``: MariaDB/MySQL can
add it with its default in place, where Django rewrites every row to give a
``text`` column its default. The column has a database default of ``''``, so
processes of the previous release (which do not name it) can still insert
while a deployment rolls out. Reversing drops the column and the links.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_intents", "0007_priority")]
    operations = [
        migrations.AddField(
            "intent",
            "trace_context",
            models.CharField(blank=True, db_default="", default="", max_length=1024),
        ),
    ]
