from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from django_intents.models import Intent
from django_intents.signals import intents_transitioned

from . import settings as suite_settings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# The tests of several databases need the second alias that INTENTS_TEST_SHARD
# adds; tests/run.py runs them in suites of their own ("shards"), and says so.
collect_ignore = [] if suite_settings.SHARD else ["test_shards.py"]


def pytest_report_header(config: pytest.Config) -> str:
    through = " through PgBouncer" if suite_settings.VENDOR == "pgbouncer" else ""
    return f"django-intents database: {settings.DATABASES['default']['ENGINE']}{through}"


def pooler_lets_go(name: str) -> None:
    """Make PgBouncer close its server connections to database ``name``, so it can
    be dropped; nothing without PgBouncer. KILL holds new clients back until RESUME."""
    if suite_settings.VENDOR != "pgbouncer":
        return
    pooler = settings.DATABASES["default"]
    command = ["psql", "-h", pooler["HOST"], "-p", str(pooler["PORT"]), "-U", pooler["USER"]]
    for admin in (f"KILL {name}", f"RESUME {name}"):
        subprocess.run([*command, "-d", "pgbouncer", "-c", admin], check=True, capture_output=True)


if suite_settings.VENDOR == "pgbouncer":

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_setup: None) -> Iterator[None]:
        """pytest-django's, and before it drops the test database, PgBouncer lets go of it.

        PgBouncer keeps its server connections to the test database open, and
        PostgreSQL refuses to drop a database that has connections.
        """
        yield
        connections["direct"].close()  # a mirror: Django closes only the alias it drops
        pooler_lets_go(settings.DATABASES["default"]["NAME"])

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        """Let every database test reach "direct" too: a pool run in the test's own
        process LISTENs there, and Django refuses aliases a test did not name."""
        both = ["default", "direct"]
        for item in items:
            marker = item.get_closest_marker("django_db")
            fixtures = getattr(item, "fixturenames", ())
            if marker is not None:
                if "databases" not in marker.kwargs:
                    kwargs = {**marker.kwargs, "databases": both}
                    item.add_marker(pytest.mark.django_db(*marker.args, **kwargs), append=False)
            elif "transactional_db" in fixtures or "live_server" in fixtures:
                item.add_marker(pytest.mark.django_db(transaction=True, databases=both))
            elif "db" in fixtures:
                item.add_marker(pytest.mark.django_db(databases=both))


@pytest.fixture
def t0() -> datetime:
    return T0


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``: tests drive time through ``now=`` with this."""
    return T0 + timedelta(seconds=seconds)


def enqueue(n: int = 1, kind: str = "webhook", **kwargs: Any) -> list[str]:
    kwargs.setdefault("now", T0)
    return [
        Intent.objects.enqueue(kind, f"event-{i}", "https://example.com/hook", {"n": i}, **kwargs)
        for i in range(n)
    ]


def intents(**keys: Any) -> dict[str, Any]:
    """The suite's ``INTENTS`` with ``keys`` changed: an override keeps the declared kinds."""
    return {**suite_settings.INTENTS, **keys}


@contextlib.contextmanager
def external_kinds(*kinds: str) -> Iterator[None]:
    """Let enqueue accept ``kinds``, which no handler of this project runs.

    For tests that hand a pool its handlers directly, or that enqueue made-up
    kinds: they declare them as a project declares kinds another service runs.
    """
    current = settings.INTENTS
    declared = [*current.get("EXTERNAL_KINDS", ()), *kinds]
    with override_settings(INTENTS={**current, "EXTERNAL_KINDS": declared}):
        yield


def rows_table(connection: Any) -> str:
    """Where the live intents' rows and their own indexes are: PostgreSQL's live
    partition (migration 0018), elsewhere (or migrated back before it) the model's table."""
    from django_intents.store.table import live_partition

    meta = Intent._meta
    if connection.vendor != "postgresql":
        return meta.db_table
    live = live_partition(meta.app_label)
    with connection.cursor() as cursor:  # Django's list of tables leaves partitions out
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [live])
        return live if cursor.fetchone()[0] else meta.db_table


def row(id: str) -> Intent:  # noqa: A002
    return Intent.objects.get(pk=id)


def snapshot() -> list[tuple[Any, ...]]:
    """Every row and every column, to prove that a refused call changed nothing."""
    return list(Intent.objects.order_by("id").values_list())


@pytest.fixture
def announced() -> Iterator[list[tuple[str, list[str]]]]:
    """What ``intents_transitioned`` says while the test runs: ``(to, sorted kinds)`` each time."""
    seen: list[tuple[str, list[str]]] = []

    def receiver(sender: Any, to: str, kinds: list[str], **kwargs: Any) -> None:
        seen.append((to, sorted(kinds)))

    intents_transitioned.connect(receiver)
    try:
        yield seen
    finally:
        intents_transitioned.disconnect(receiver)


@pytest.fixture
def vendor() -> str:
    return connection.vendor


# CI runs the same Hypothesis examples every time, so a red build is always
# reproducible and never the luck of one draw; locally each run explores anew.
if os.environ.get("CI"):
    from hypothesis import settings as hypothesis_settings

    hypothesis_settings.register_profile("ci", derandomize=True, database=None)
    hypothesis_settings.load_profile("ci")


@pytest.fixture
def empty_database(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """The ``NAME`` of a database that exists but has no tables of ours."""
    if connection.vendor == "sqlite":
        path = tmp_path / "other-app.sqlite3"
        with sqlite3.connect(path) as other:
            other.execute("CREATE TABLE other_app_thing (id integer)")
        other.close()
        yield str(path)
        return
    name = f"{connection.settings_dict['NAME']}_empty"
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    yield name
    pooler_lets_go(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")


def branch_plan(plan: str, name: str) -> str:
    """The part of a PostgreSQL claim's plan for one branch (``branch_high``, ``branch_zero``,
    ``branch_low`` in ``store/sql/postgresql.sql``)."""
    return plan.split(f"CTE branch_{name}")[1].split("CTE branch_")[0]
