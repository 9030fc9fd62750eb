"""The admin on a big table: how long each list view takes at N intents.

    BENCH_DB=postgresql BENCH_DB_PREFIX=admin5m \\
        python -m bench.admin_bench --rows 5000000 [--fast-fill] [--out admin.json]

Loads the table once through ``enqueue_many`` (kept between runs of the same
size, in a database of its own): ten kinds, fifty targets, created over thirty
days, 97 % completed, the rest pending, some of them failing. ``--fast-fill``
(PostgreSQL, MariaDB) writes the rows with ``INSERT ... SELECT`` from a series
on the server instead, half an hour's load in minutes: the same kinds, targets,
span and ids as ``enqueue_many`` gives, 95 % completed, 2 % cancelled, 3 %
pending (a third of them failing) and 200 running among the newest. Then times,
with Django's test client and a logged-in superuser, the median of three
after one warm-up: the changelist, a filter by kind and by state, a search by
an id prefix and by an event id, a deep page, the summary above the list, and
the dashboard (its rollup filled first with two days of minutes for every
kind, as pools leave it); and counts the statements an action on 10 and on 100
selected intents runs (rolled back, so the table is the same for the next run).
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
SLOW = 0.2  # seconds: a statement this slow is printed with its text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--fast-fill",
        action="store_true",
        help="fill on the server with INSERT ... SELECT (postgresql, mysql), not enqueue_many",
    )
    args = parser.parse_args()

    import django
    from django.conf import settings

    from .suite import _create_database

    _create_database(settings.VENDOR, settings.NAME)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.fast_fill and settings.VENDOR not in FAST_FILL:
        parser.error(f"--fast-fill needs BENCH_DB=postgresql or mysql, not {settings.VENDOR}")
    load(args.rows, fast=args.fast_fill)
    figures = measure(args.rows, args.repeat)
    for name, value in figures.items():
        print(f"{name:32} {value}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=2)


def load(rows: int, *, fast: bool = False) -> None:
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
    if fast:
        fast_fill(rows, start, settings.KINDS)
    for number, first in enumerate(range(0, 0 if fast else rows, BATCH)):
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


# ``fast_fill``'s row ``i``, spelled per database: the intent's id as
# ``rules.identity.digest`` makes it, its kind (``%s`` placeholders, one per
# kind), the series of ``i`` between two bounds, and its payload.
FAST_FILL = {
    "postgresql": {
        "id": "encode(sha256(convert_to(k, 'UTF8') || '\\x00'::bytea || convert_to(e, 'UTF8')"
        " || '\\x00'::bytea || convert_to(t, 'UTF8')), 'hex')",
        "kind": "(ARRAY[{kinds}])[MOD(i, {count}) + 1]",
        "series": "generate_series({first}, {last}) AS g(i)",
        "payload": "jsonb_build_object('n', i)",
        "at": "%s::timestamptz + i * %s::bigint * interval '1 microsecond'",
        "token": "md5(i::text)",
        "text": "i::text",
        "tens": "i / 10",
    },
    "mysql": {
        "id": "SHA2(CONCAT(k, CHAR(0 USING utf8mb4), e, CHAR(0 USING utf8mb4), t), 256)",
        "kind": "ELT(MOD(i, {count}) + 1, {kinds})",
        "series": "(SELECT seq AS i FROM seq_{first}_to_{last}) AS g",
        "payload": "JSON_OBJECT('n', i)",
        "at": "TIMESTAMPADD(MICROSECOND, i * %s, %s)",
        "token": "MD5(i)",
        "text": "CAST(i AS CHAR)",
        "tens": "i DIV 10",
    },
}
FAST_CHUNK = 500_000


def fast_fill(rows: int, start: datetime, kinds: list[str]) -> None:
    """``rows`` intents written by the server from a series, ``FAST_CHUNK`` per statement.

    Row ``i`` is created at ``start + SPAN * i / rows`` with kind ``i`` modulo
    the kinds and target ``i % 50``, as ``load`` spreads them. Its state goes by
    ``r``, its block of ten rows (so every kind, up to ten, has the same mix)
    modulo a hundred: 95 completed, 2 cancelled and 3 pending, the last of
    those failing (two attempts, due in two months). Among the newest 20,000
    rows, the pending ones at 98 are running instead, with a lease of five
    minutes: about 200, what a few busy pools hold.
    """
    from django.db import connection

    from django_intents.models import Intent

    spell = FAST_FILL[connection.vendor]
    holes = ", ".join(["%s"] * len(kinds))
    step = int(SPAN / timedelta(microseconds=1) / rows)
    ops = connection.ops
    begin = ops.adapt_datetimefield_value(start)
    lease = ops.adapt_datetimefield_value(datetime.now(UTC) + timedelta(minutes=5))
    at_params = [begin, step] if connection.vendor == "postgresql" else [step, begin]
    running = f"(i >= {rows - 20_000} AND r = 98)"
    finished = "r < 97"
    began = time.monotonic()
    for first in range(0, rows, FAST_CHUNK):
        last = min(first + FAST_CHUNK, rows) - 1
        sql = f"""
            INSERT INTO {Intent._meta.db_table} (id, kind, event_id, target, payload, state,
                attempts, snoozes, written_off, priority, next_at, created_at, updated_at,
                last_error, last_traceback, claim_token, claim_until, trace_context)
            SELECT {spell["id"]}, k, e, t, p,
                CASE WHEN {running} THEN 'running' WHEN r < 95 THEN 'completed'
                    WHEN {finished} THEN 'cancelled' ELSE 'pending' END,
                CASE WHEN r = 99 THEN 2
                    WHEN r < 95 OR {running} THEN 1 ELSE 0 END,
                0, 0, 0,
                CASE WHEN r = 99 THEN a + {_interval(connection.vendor, 60 * 86400)}
                    ELSE a END,
                a,
                CASE WHEN {finished} THEN a + {_interval(connection.vendor, 1)} ELSE a END,
                CASE WHEN r = 99 THEN 'ConnectionError: partner down' ELSE '' END,
                '',
                CASE WHEN {running} THEN {spell["token"]} ELSE '' END,
                CASE WHEN {running} THEN %s END,
                ''
            FROM (
                SELECT i, MOD({spell["tens"]}, 100) AS r,
                    {spell["kind"].format(kinds=holes, count=len(kinds))} AS k,
                    CONCAT('event-', {spell["text"]}) AS e,
                    CONCAT('https://partner-', MOD(i, {TARGETS}), '.example/hook') AS t,
                    {spell["payload"]} AS p, {spell["at"]} AS a
                FROM {spell["series"].format(first=first, last=last)}
            ) AS s
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, [lease, *kinds, *at_params])
        print(f"filled {last + 1:,} rows in {time.monotonic() - began:.0f} s", file=sys.stderr)


def _interval(vendor: str, seconds: int) -> str:
    """``seconds`` as an interval added to a timestamp, in ``vendor``'s spelling."""
    if vendor == "postgresql":
        return f"interval '{seconds} seconds'"
    return f"INTERVAL {seconds} SECOND"


def fill_rollup() -> None:
    """Two days of minutes for every kind, ending now: what running pools leave the
    dashboard to read (rewritten on every run, so it always ends at the present)."""
    from django.conf import settings
    from django.utils import timezone

    from django_intents.models import Rollup

    now = timezone.now().replace(second=0, microsecond=0)
    Rollup.objects.all().delete()
    Rollup.objects.bulk_create(
        (
            Rollup(
                minute=now - timedelta(minutes=minute),
                kind=kind,
                completed=20 + (minute + number) % 7,
                failed=(minute * number) % 3,
                snoozed=minute % 2,
                cancelled=int(minute % 60 == number),
                attempts=25,
                duration_sum=25 * 0.05,
                duration_max=0.2,
                due=100 + minute % 30,
                running=number,
            )
            for minute in range(2 * 24 * 60)
            for number, kind in enumerate(settings.KINDS)
        ),
        batch_size=1000,
    )


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
        "dashboard": page("dashboard/"),
    }
    fill_rollup()
    for number in (500, 5000):  # a page past the last is a redirect
        if rows <= number * 100:
            del views[f"page {number}"]
    figures: dict[str, Any] = {"rows": rows, "vendor": connection.vendor}
    for name, view in views.items():
        view()  # warm-up
        times, database = [], []
        for _ in range(repeat):
            began = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                view()
            times.append((time.perf_counter() - began) * 1000)
            database.append(sum(float(query["time"]) for query in queries.captured_queries) * 1000)
        figures[f"{name} ms"] = round(statistics.median(times), 1)
        figures[f"{name} queries"] = len(queries)
        figures[f"{name} database ms"] = round(statistics.median(database), 1)
        slowest = max(queries.captured_queries, key=lambda query: float(query["time"]))
        figures[f"{name} slowest statement ms"] = round(float(slowest["time"]) * 1000, 1)
        if float(slowest["time"]) > SLOW:
            print(
                f"{name}: {float(slowest['time']):.3f} s in {slowest['sql'][:300]}", file=sys.stderr
            )
    for size in (1, 10, 100):  # the first is a warm-up (Django caches the content type)
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            confirmed = {"action": "cancel", "_selected_action": pending[:size], "post": "yes"}
            response = client.post(URL, confirmed)  # as its confirmation page posts it
            assert response.status_code == 302, response.status_code
            transaction.set_rollback(True)
        if size > 1:
            figures[f"cancel {size} statements"] = len(queries)
    return figures


if __name__ == "__main__":
    main()
