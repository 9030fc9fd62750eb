"""``INTENTS["LISTEN_DATABASE"]`` and the start-up NOTIFY self-test (SPEC §12).

Behind PgBouncer in transaction mode a LISTEN lands on whichever server
connection the pooler lends for that one statement, and hears nothing after.
The listener proves its LISTEN at start-up with a NOTIFY sent the way enqueue
sends one; CI runs this module in the ``pgbouncer`` configuration too
(``INTENTS_TEST_DB=pgbouncer``), where "direct" is an unpooled alias.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.conf import parse
from django_intents.models import Intent
from django_intents.store import backend_for
from django_intents.worker.outage import PREPARE_AFTER, reuse_connection
from django_intents.worker.wakeup import Listener

from . import settings as suite_settings
from .workerutil import Worker, wait_for

POSTGRESQL = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"
)
POOLED = pytest.mark.skipif(
    suite_settings.VENDOR != "pgbouncer",
    reason="needs PgBouncer in front (INTENTS_TEST_DB=pgbouncer, which CI runs)",
)
DIRECT = "direct" if "direct" in settings.DATABASES else "default"
FELL_BACK = "heard no NOTIFY"


class ElsewhereListener(Listener):
    """Listens on another database of the same server: no NOTIFY of ours reaches it."""

    def _connect(self, alias: str) -> BaseDatabaseWrapper:
        if alias != "elsewhere":
            return super()._connect(alias)
        base = connections[DIRECT]
        wrapper: BaseDatabaseWrapper = type(base)({**base.settings_dict, "NAME": "postgres"}, alias)
        wrapper.ensure_connection()
        return wrapper


@pytest.fixture
def listeners() -> Iterator[Any]:
    started: list[Listener] = []

    def start(listen: str, cls: type[Listener] = Listener) -> tuple[Listener, threading.Event]:
        woken = threading.Event()
        listener = cls(using="default", kinds={"webhook"}, wake=woken.set, listen=listen)
        listener.start()
        started.append(listener)
        return listener, woken

    yield start
    for listener in started:
        listener.stop()


def complete_through(worker: Worker, *, after: str, name: str, count: int) -> list[str]:
    """Once ``after`` is in the pool's log, enqueue ``count`` intents, wait until the
    pool completed them, and stop it with SIGTERM; a clean exit is asserted."""
    wait_for(lambda: after in worker.log, f"{after!r} in the log", timeout=20)
    ids = [Intent.objects.enqueue("test.ok", f"{name}-{i}", "t") for i in range(count)]
    wait_for(
        lambda: Intent.objects.filter(id__in=ids, state="completed").count() == count,
        "the intents to complete",
    )
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    return ids


def fallbacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if FELL_BACK in r.getMessage()]


def test_listen_database_must_name_a_configured_alias():
    _, errors = parse({"LISTEN_DATABASE": "nowhere"})
    assert [str(e) for e in errors] == [
        "INTENTS['LISTEN_DATABASE'] must be a database alias "
        f"({', '.join(repr(a) for a in settings.DATABASES)}), not 'nowhere'"
    ]
    built, errors = parse({"LISTEN_DATABASE": DIRECT})
    assert (built.listen_database, errors) == (DIRECT, [])


@POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_listen_on_a_direct_connection_wakes_on_an_enqueue_through_the_queue_alias(
    listeners, caplog
):
    listener, woken = listeners(DIRECT)
    assert listener.listening.wait(10), "the start-up NOTIFY never arrived"
    woken.clear()
    started = time.monotonic()
    Intent.objects.enqueue("webhook", "heard", "https://example.com/hook")
    assert woken.wait(2)
    # Milliseconds here; the bound leaves room for a loaded CI machine, and is
    # still far below any poll interval a pool would fall back to.
    assert time.monotonic() - started < 0.5
    assert not listener.fell_back.is_set()
    assert fallbacks(caplog) == []


@POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_a_listen_that_hears_no_notify_falls_back_to_polling_with_one_warning(
    listeners, caplog, monkeypatch
):
    monkeypatch.setattr(Listener, "SELF_TEST", 1.0)
    listener, _ = listeners("elsewhere", ElsewhereListener)
    assert listener.fell_back.wait(10)
    wait_for(lambda: not listener._thread.is_alive(), "the listener to end")
    assert not listener.listening.is_set()
    [warning] = fallbacks(caplog)
    assert "LISTEN on database 'elsewhere' heard no NOTIFY sent through 'default'" in warning
    assert "Polling only" in warning


@POOLED
@pytest.mark.django_db(transaction=True)
def test_listen_through_the_pooler_is_detected_and_names_the_setting(
    listeners, caplog, monkeypatch
):
    monkeypatch.setattr(Listener, "SELF_TEST", 1.0)
    listener, _ = listeners("default")
    assert listener.fell_back.wait(10)
    wait_for(lambda: not listener._thread.is_alive(), "the listener to end")
    [warning] = fallbacks(caplog)
    assert "PgBouncer" in warning and "INTENTS['LISTEN_DATABASE']" in warning


@POOLED
@pytest.mark.django_db(transaction=True)
def test_a_pool_behind_the_pooler_without_listen_database_warns_once_and_polls(caplog):
    caplog.set_level(logging.WARNING)
    worker = Worker(
        ["--workers", "2", "--lease", "3", "--renew", "1"],
        {"LISTEN_DATABASE": None, "POLL_INTERVAL": 0.2},
        {},
    )
    try:
        complete_through(worker, after=FELL_BACK, name="polled", count=3)
        assert worker.log.count(FELL_BACK) == 1
        assert "preparing the statements" not in worker.log  # a pooler may be in between
    finally:
        worker.cleanup()


# -- what a proven LISTEN says of the queue's alias: prepared statements ----------------

DIRECT_ONLY = pytest.mark.skipif(
    suite_settings.VENDOR != "postgresql", reason="needs PostgreSQL without a pooler"
)
PREPARING = "preparing the statements the pool repeats"


@DIRECT_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_listen_proven_on_the_queue_alias_says_that_alias_is_direct(listeners):
    listener, _ = listeners("default")
    assert listener.listening.wait(10), "the start-up NOTIFY never arrived"
    assert listener.direct.is_set()


@POOLED
@pytest.mark.django_db(transaction=True)
def test_a_listen_proven_on_another_alias_says_nothing_of_the_queue_alias(listeners):
    listener, _ = listeners(DIRECT)
    assert listener.listening.wait(10), "the start-up NOTIFY never arrived"
    assert not listener.direct.is_set()


@DIRECT_ONLY
@pytest.mark.django_db(transaction=True)
def test_the_pool_connection_prepares_what_it_repeats_only_once_proven_direct():
    connection.ensure_connection()
    raw = connection.connection
    try:
        reuse_connection("default")
        assert raw.prepare_threshold is None  # Django's default: nothing prepared
        reuse_connection("default", prepare=True)
        assert raw.prepare_threshold == PREPARE_AFTER
        # The backend's cursors bind on the server, which psycopg can prepare;
        # Django's own bind on the client, and are never prepared.
        with backend_for(connection, Intent).cursor() as cursor:
            for _ in range(PREPARE_AFTER + 1):
                cursor.execute("SELECT count(*) FROM django_intents_intent WHERE kind = %s", ["x"])
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone()[0] >= 1
    finally:
        raw.prepare_threshold = None
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")


@DIRECT_ONLY
@pytest.mark.django_db(transaction=True)
def test_a_pool_on_a_direct_connection_prepares_its_statements_and_runs_as_before():
    worker = Worker(["--workers", "2", "--lease", "3", "--renew", "1"], {"POLL_INTERVAL": 0.2}, {})
    try:
        ids = complete_through(worker, after=PREPARING, name="prepared", count=5)
        assert worker.log.count(PREPARING) == 1
        assert set(Intent.objects.filter(id__in=ids).values_list("state", "attempts")) == {
            ("completed", 1)
        }
    finally:
        worker.cleanup()
