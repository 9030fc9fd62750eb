"""The admin on a big table: how long each list view takes at N intents.

    BENCH_DB=postgresql BENCH_DB_PREFIX=admin5m \\
        python -m bench.admin_bench --rows 5000000 [--out admin.json]

Loads the table once through ``enqueue_many`` (kept between runs of the same
size, in a database of its own): ten kinds, fifty targets, created over thirty
days, 97 % completed, the rest pending, some of them failing. Then times,
with Django's test client and a logged-in superuser, the median of three
after one warm-up: the changelist, a filter by kind and by state, a search by
an id prefix and by an event id, a deep page, and the summary above the list;
and counts the statements an action on 10 and on 100 selected intents runs
(rolled back, so the table is the same for the next run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.admin_settings")

BATCH = 10_000
FINISHED_SHARE = 0.97
TARGETS = 50
SPAN = timedelta(days=30)
URL = "/admin/django_intents/intent/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import django
    from django.conf import settings

    from .suite import _create_database

    _create_database(settings.VENDOR, settings.NAME)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    load(args.rows)
    figures = measure(args.rows, args.repeat)
    for name, value in figures.items():
        print(f"{name:32} {value}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=2)


def load(rows: int) -> None:
    """Fill the table with ``rows`` intents unless it holds them already."""
    from django.conf import settings
    from django.db import connection

    from django_intents.models import Intent

    have = Intent.objects.count()
    if have == rows:
        return
    if have:
        Intent.objects.all().delete()
    start = datetime.now(UTC) - SPAN
    step = SPAN / max(rows // BATCH, 1)
    began = time.monotonic()
    for number, first in enumerate(range(0, rows, BATCH)):
        at = start + step * number
        batch = range(first, min(first + BATCH, rows))
        ids = Intent.objects.enqueue_many(
            (
                {
                    "kind": settings.KINDS[i % len(settings.KINDS)],
                    "event_id": f"event-{i}",
                    "target": f"https://partner-{i % TARGETS}.example/hook",
                    "payload": {"n": i},
                }
                for i in batch
            ),
            now=at,
        )
        cut = int(len(ids) * FINISHED_SHARE)
        Intent.objects.filter(pk__in=ids[:cut]).update(
            state="completed", attempts=1, updated_at=at + timedelta(seconds=1)
        )
        failing = ids[cut : cut + len(ids) // 100]
        Intent.objects.filter(pk__in=failing).update(
            attempts=2, last_error="ConnectionError: partner down", next_at=at + SPAN * 2
        )
        if number % 50 == 0:
            print(f"loaded {first + len(ids):,} rows", file=sys.stderr)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"VACUUM ANALYZE {Intent._meta.db_table}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {Intent._meta.db_table}")
        else:
            cursor.execute("ANALYZE")
    print(f"loaded {rows:,} rows in {time.monotonic() - began:.0f} s", file=sys.stderr)


def measure(rows: int, repeat: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.db import connection, transaction
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from django_intents.admin.summary import queue_summary
    from django_intents.models import Intent

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)
    sample = Intent.objects.filter(event_id="event-4321").only("id").get()
    pending = list(Intent.objects.filter(state="pending").values_list("pk", flat=True)[:100])

    def page(query: str) -> Callable[[], None]:
        def get() -> None:
            response = client.get(URL + query)
            if response.status_code != 200:
                raise RuntimeError(f"{query}: {response.status_code}")

        return get

    views = {
        "changelist": page(""),
        "filter kind": page("?kind=bench.admin.kind3"),
        "filter state pending": page("?state__exact=pending"),
        "search id prefix": page(f"?q={sample.id[:10]}"),
        "search event id": page("?q=event-4321"),
        "page 500": page("?p=500"),
        "page 5000": page("?p=5000"),
        "summary": queue_summary,
    }
    if rows <= 5000 * 100:  # a page past the last is a redirect
        del views["page 5000"]
    figures: dict[str, Any] = {"rows": rows, "vendor": connection.vendor}
    for name, view in views.items():
        view()  # warm-up
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                view()
            times.append((time.perf_counter() - began) * 1000)
        figures[f"{name} ms"] = round(statistics.median(times), 1)
        figures[f"{name} queries"] = len(queries)
    for size in (1, 10, 100):  # the first is a warm-up (Django caches the content type)
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            response = client.post(URL, {"action": "cancel", "_selected_action": pending[:size]})
            assert response.status_code == 302, response.status_code
            transaction.set_rollback(True)
        if size > 1:
            figures[f"cancel {size} statements"] = len(queries)
    return figures


if __name__ == "__main__":
    main()
