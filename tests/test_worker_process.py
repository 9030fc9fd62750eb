"""``manage.py run_intent_workers`` as a real process: drain, crash, signals, fencing, outages.

Each test starts workers with ``start_worker`` (tests/workerutil.py) against the
test database, acts on them with real signals, and checks the rows afterwards.
Leases are 1-2 s and every wait has a timeout.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_intents import backoff
from django_intents.models import Intent
from django_intents.store import clock
from django_intents.store.clock import server_now
from tests.testapp.models import Effect

from . import settings as suite_settings
from .conftest import external_kinds, row, snapshot
from .workerutil import Worker, wait_for

SHORT = ["--lease", "1.5", "--renew", "0.3"]


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """Start workers with ``start_worker("--drain", intents={...})``; all die at teardown.

    Depending on ``transactional_db`` makes every row a test writes committed, so
    the worker sees it, and makes the workers go before the tables are flushed.
    """
    workers: list[Worker] = []

    def start(*args: str, intents: dict[str, Any] | None = None, **env: str) -> Worker:
        workers.append(Worker(list(args), intents or {}, env))
        return workers[-1]

    yield start
    for worker in workers:
        worker.cleanup()


def enqueue(kind: str, event: str = "e", payload: object = None, **kwargs: object) -> str:
    return Intent.objects.enqueue(kind, event, "https://example.com/hook", payload, **kwargs)


def notes(id: str) -> list[str]:  # noqa: A002
    return list(Effect.objects.filter(intent_id=id).order_by("id").values_list("note", flat=True))


def has_note(id: str, prefix: str) -> str | None:  # noqa: A002
    return next((note for note in notes(id) if note.startswith(prefix)), None)


def is_state(id: str, state: str) -> bool:  # noqa: A002
    return row(id).state == state


def assert_due_now_and_unclaimed(id: str, before: datetime) -> None:  # noqa: A002
    """Released due now: ``next_at`` by the worker's clock, after ``before`` by ours.

    Each process carries the server's time from a reading of its own, which
    lags the server by up to that reading's round trip (``clock.ROUND_TRIP``
    at most), so the worker's "now" may trail ours by as much.
    """
    fresh = row(id)
    assert fresh.state == Intent.State.PENDING
    assert (fresh.claim_token, fresh.claim_until) == ("", None)
    lag = timedelta(seconds=clock.ROUND_TRIP)
    assert before - lag <= fresh.next_at <= timezone.now()


# test.dotted is run by the worker's settings (tests/worker_settings.py), test.nobody by nothing.
@external_kinds("test.dotted", "test.nobody")
def test_drain_processes_a_mix_and_leaves_what_it_must_not_touch(start_worker):
    ok = [enqueue("test.ok", f"ok-{i}") for i in range(3)]
    dotted = enqueue("test.dotted")
    failing = enqueue("test.fail", payload={"n": 1})
    exhausted = enqueue("test.fail", "exhausted", payload={"n": 2})
    stopped = enqueue("test.stop")
    unknown = enqueue("test.nobody")
    later = enqueue("test.ok", "later", next_at=timezone.now() + timedelta(hours=1))
    # Earlier attempts, so the retry backs off a minute (not due again during
    # the drain) and the other one uses its last attempt.
    Intent.objects.filter(pk=failing).update(attempts=5)
    Intent.objects.filter(pk=exhausted).update(attempts=7)
    untouched = [r for r in snapshot() if r[0] in (unknown, later)]

    worker = start_worker("--drain", "--workers", "3", intents={"MAX_ATTEMPTS": 8})
    worker.assert_clean_exit(timeout=30)

    for id in [*ok, dotted]:
        fresh = row(id)
        assert (fresh.state, fresh.attempts, fresh.claim_token) == ("completed", 1, "")
    assert notes(dotted) == ["dotted"]
    retried = row(failing)
    assert (retried.state, retried.attempts) == (Intent.State.PENDING, 6)
    assert retried.last_error == "ValueError: boom 1"
    assert retried.next_at - retried.updated_at == backoff(failing, 6)
    assert retried.next_at > timezone.now()
    assert (retried.claim_token, retried.claim_until) == ("", None)
    gave_up = row(exhausted)
    assert (gave_up.state, gave_up.attempts) == (Intent.State.CANCELLED, 8)
    assert gave_up.last_error == "ValueError: boom 2"
    cancelled = row(stopped)
    assert (cancelled.state, cancelled.last_error) == (Intent.State.CANCELLED, "gone for good")
    assert [r for r in snapshot() if r[0] in (unknown, later)] == untouched

    start = next(line for line in worker.log.splitlines() if "starting" in line)
    assert connection.vendor in start
    assert "test.ok -> tests.testapp.handlers.ok" in start
    assert "test.dotted -> tests.testapp.handlers.dotted" in start
    assert "no handler in this project runs: test.nobody (1 due)" in worker.log
    assert "3 worker thread(s)" in start
    assert "lease 30 s" in start
    assert "ValueError: boom 1; retry in" in worker.log
    assert "MAX_ATTEMPTS (8) reached" in worker.log


def test_kinds_option_claims_only_those_kinds(start_worker):
    ok = enqueue("test.ok")
    other = enqueue("test.stop")

    start_worker("--drain", "--kinds", "test.ok").assert_clean_exit(timeout=30)

    assert row(ok).state == Intent.State.COMPLETED
    assert (row(other).state, row(other).attempts) == (Intent.State.PENDING, 0)


def test_unknown_kind_option_refuses_to_start_and_claims_nothing(start_worker):
    enqueue("test.ok")
    before = snapshot()

    worker = start_worker("--drain", "--kinds", "test.ok,test.nobody")

    assert worker.wait(30) != 0
    assert "no handler for kind(s) test.nobody" in worker.log
    assert snapshot() == before


def test_sigkill_mid_handler_then_a_second_worker_completes_it_after_the_lease(start_worker):
    id = enqueue("test.sleepy", payload={"slow_attempts": 1})
    first = start_worker(*SHORT)
    wait_for(lambda: has_note(id, "start 1"), "the first attempt to start")

    first.kill_group()

    crashed = row(id)
    assert (crashed.state, crashed.attempts) == (Intent.State.RUNNING, 1)
    second = start_worker(*SHORT)
    wait_for(lambda: is_state(id, "completed"), "the second worker to complete it")
    second.signal(signal.SIGTERM)
    second.assert_clean_exit(timeout=15)
    done = row(id)
    assert (done.attempts, done.claim_token, done.last_error) == (2, "", "")
    assert notes(id) == ["start 1", "start 2"]


def test_sigterm_during_a_handler_that_checks_cancelled_releases_it_due_now(start_worker):
    id = enqueue("test.sleepy", payload={"on_cancel": "raise"})
    worker = start_worker(*SHORT, "--grace", "20")
    wait_for(lambda: has_note(id, "start 1"), "the handler to start")
    before = server_now()

    worker.signal(signal.SIGTERM)

    worker.assert_clean_exit(timeout=15)
    assert_due_now_and_unclaimed(id, before)
    assert row(id).attempts == 1
    assert has_note(id, "cancelled 1")
    assert "stopping on SIGTERM" in worker.log


def stopping_line(log: str) -> str:
    return next(line for line in log.splitlines() if "stopping" in line)


def sigterm_a_handler_that_ignores_cancelled(start_worker, grace: str) -> tuple[str, Worker]:
    """Start a worker on a handler that ignores ``cancelled``, SIGTERM it, wait for its exit."""
    id = enqueue("test.sleepy", payload={"on_cancel": "ignore"})
    worker = start_worker(*SHORT, "--grace", grace)
    wait_for(lambda: has_note(id, "start 1"), "the handler to start")
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    return id, worker


def test_the_stop_line_says_attempts_were_asked_to_stop_not_intents_cancelled(start_worker):
    id, worker = sigterm_a_handler_that_ignores_cancelled(start_worker, "0.5")

    line = stopping_line(worker.log)
    assert "1 running attempt(s) asked to stop (attempt.cancelled set)" in line
    assert "released, their intents back to pending, due now" in line
    assert "attempt(s) cancelled" not in worker.log
    assert (row(id).state, row(id).claim_token) == (Intent.State.PENDING, "")


def test_sigterm_with_a_handler_ignoring_cancelled_releases_it_after_the_grace(start_worker):
    before = server_now()
    id, worker = sigterm_a_handler_that_ignores_cancelled(start_worker, "1")

    assert_due_now_and_unclaimed(id, before)
    assert "released, due now" in worker.log
    assert not has_note(id, "done")


def test_sigint_with_a_handler_returning_within_the_grace_records_its_result(start_worker):
    id = enqueue("test.sleepy", payload={"on_cancel": "return"})
    worker = start_worker(*SHORT, "--grace", "20")
    wait_for(lambda: has_note(id, "start 1"), "the handler to start")

    worker.signal(signal.SIGINT)

    worker.assert_clean_exit(timeout=15)
    done = row(id)
    assert (done.state, done.attempts, done.claim_token) == ("completed", 1, "")
    assert has_note(id, "cancelled 1")


def test_a_second_signal_releases_running_handlers_at_once(start_worker):
    id = enqueue("test.sleepy", payload={"on_cancel": "ignore"})
    worker = start_worker(*SHORT, "--grace", "60")
    wait_for(lambda: has_note(id, "start 1"), "the handler to start")
    before = server_now()

    worker.signal(signal.SIGTERM)
    wait_for(lambda: "stopping on SIGTERM" in worker.log, "the first signal to be seen")
    worker.signal(signal.SIGTERM)

    worker.assert_clean_exit(timeout=15)
    assert_due_now_and_unclaimed(id, before)


def fence_a_running_handler(start_worker: Callable[..., Worker], action: str) -> tuple[str, Worker]:
    """Start a handler that watches ``attempt.cancelled`` and returns when it is set
    (a stale success), apply the administrative ``action`` to its intent, and check
    the handler was told within one renewal period (0.3 s, plus room for a loaded
    machine)."""
    id = enqueue("test.sleepy", payload={"on_cancel": "return", "slow_attempts": 1})
    worker = start_worker(*SHORT, "--workers", "1")
    wait_for(lambda: has_note(id, "start 1"), "the handler to start")
    acted = time.time()

    assert getattr(Intent.objects, action)(id) is True

    seen = wait_for(lambda: has_note(id, "cancelled 1"), "attempt.cancelled to be set")
    assert float(seen.split()[-1]) - acted < 0.3 + 2.0
    return id, worker


def test_admin_retry_now_during_a_handler_drops_its_stale_result_and_runs_it_again(start_worker):
    id, worker = fence_a_running_handler(start_worker, "retry_now")

    wait_for(lambda: is_state(id, "completed"), "the second attempt")
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    final = row(id)
    assert (final.state, final.attempts, final.claim_token) == ("completed", 2, "")
    assert notes(id)[-1] == "start 2"
    assert "claim lost" in worker.log


def test_admin_cancel_during_a_handler_drops_its_stale_result(start_worker):
    id, worker = fence_a_running_handler(start_worker, "cancel")

    wait_for(lambda: "result dropped" in worker.log, "the stale result to be dropped")
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    final = row(id)
    assert (final.state, final.attempts, final.last_error) == ("cancelled", 1, "")
    assert (final.claim_token, final.claim_until) == ("", None)
    assert "claim lost" in worker.log


def test_atomic_in_a_worker_commits_with_completion_and_rolls_back_when_fenced(start_worker):
    plain = enqueue("test.atomic", "plain")
    fenced = enqueue("test.atomic", "fenced", payload={"wait_cancel_attempts": 1})
    worker = start_worker(*SHORT, "--workers", "2")
    wait_for(lambda: is_state(plain, "completed"), "the plain intent")
    wait_for(lambda: has_note(fenced, "start 1"), "the fenced handler to start")

    assert Intent.objects.retry_now(fenced) is True

    wait_for(lambda: is_state(fenced, "completed"), "the second attempt to complete")
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert notes(plain) == ["start 1", "atomic 1"]
    # Attempt 1 wrote inside attempt.atomic() after it was fenced: rolled back.
    assert notes(fenced) == ["start 1", "start 2", "atomic 2"]
    assert row(fenced).attempts == 2


def test_unreachable_database_exits_non_zero_with_one_error_line(start_worker):
    enqueue("test.ok")
    before = snapshot()
    worker = start_worker("--db-error-timeout", "1.5", INTENTS_TEST_UNREACHABLE="1")

    code = worker.wait(30)

    assert snapshot() == before

    assert code != 0
    errors = [line for line in worker.log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, worker.log
    assert "database unavailable for" in errors[0]
    assert "exiting" in errors[0]
    assert "Traceback" not in worker.log


SERVER_SIDE_KILL = {
    "postgresql": (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ),
    "mysql": (
        "SELECT id FROM information_schema.processlist "
        "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
    ),
}


def kill_other_connections() -> int:
    """Terminate, from the server side, every other connection to the test database."""
    with connection.cursor() as cursor:
        cursor.execute(SERVER_SIDE_KILL[connection.vendor])
        found = cursor.fetchall()
        if connection.vendor == "mysql":
            for (pid,) in found:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
    return len(found)


@pytest.mark.skipif(
    connection.vendor not in SERVER_SIDE_KILL, reason="SQLite has no server connections to kill"
)
@pytest.mark.parametrize("conn_max_age", ["0", "None"], ids=["per-iteration", "persistent"])
def test_connections_killed_server_side_mid_run_the_pool_reconnects_and_finishes(
    start_worker, conn_max_age
):
    ids = [
        enqueue("test.sleepy", f"e{i}", payload={"seconds": 0.4, "on_cancel": "ignore"})
        for i in range(8)
    ]
    worker = start_worker(
        "--workers", "2", "--lease", "2", "--renew", "0.25", INTENTS_TEST_CONN_MAX_AGE=conn_max_age
    )
    wait_for(lambda: sum(is_state(id, "completed") for id in ids) >= 2, "some progress")

    assert kill_other_connections() >= 1  # short-lived connections may be between queries

    wait_for(lambda: all(is_state(id, "completed") for id in ids), "every intent", timeout=60)
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert all(row(id).claim_token == "" for id in ids)
    if conn_max_age == "None" and suite_settings.VENDOR != "pgbouncer":
        # Persistent connections meet the dead ones: the errors are seen and survived.
        # (Behind PgBouncer the pooler replaces a dead server connection between
        # transactions, so the pool may never see one.)
        assert "database error" in worker.log, worker.log
    if conn_max_age == "None" and suite_settings.VENDOR == "postgresql":
        # The reopened connection has none of the old one's prepared statements,
        # and the pool prepares again on it (outage.reuse_connection).
        assert worker.log.count("preparing the statements") >= 2, worker.log
    if connection.vendor == "postgresql":
        assert "LISTEN connection is back" in worker.log, worker.log


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_an_idle_pool_on_postgresql_is_woken_by_notify_not_by_polling(start_worker):
    worker = start_worker("--kinds", "test.ok", intents={"POLL_INTERVAL": 60})
    wait_for(lambda: "listening for new intents" in worker.log, "the pool to LISTEN")
    time.sleep(1.0)  # past the first claim: from here on only a notification wakes it

    id = enqueue("test.ok")

    wait_for(lambda: is_state(id, "completed"), "the notified pool", timeout=20)
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)


def test_metrics_port_serves_health_and_handler_metrics(start_worker):
    id = enqueue("test.ok")
    worker = start_worker("--metrics-port", "0", "--kinds", "test.ok")
    line = wait_for(
        lambda: next((x for x in worker.log.splitlines() if "serving /metrics" in x), None),
        "the metrics server to start",
    )
    base = "http://" + line.rsplit(" ", 1)[-1]
    wait_for(lambda: is_state(id, "completed"), "the intent to complete")

    with urllib.request.urlopen(base + "/healthz", timeout=10) as response:  # noqa: S310
        assert (response.status, response.read()) == (200, b"ok\n")
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:  # noqa: S310
        exported = response.read().decode()
    # test.ok has a handler, so it keeps its label without METRIC_KINDS.
    assert (
        'django_intents_handler_duration_seconds_count{database="default",kind="test.ok",'
        'outcome="success"} 1.0' in (exported)
    )
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)


# -- before migrate ----------------------------------------------------------------


def assert_refused_before_migrate(worker: Worker, where: str) -> None:
    started = time.monotonic()
    code = worker.wait(30)
    assert code != 0
    assert time.monotonic() - started < 15  # not after --db-error-timeout's 60 s
    expected = f"CommandError: the intents table does not exist: run `manage.py migrate` ({where})"
    assert worker.log.strip() == expected, worker.log
    assert "database error" not in worker.log


def test_workers_on_a_database_never_migrated_exit_at_once_naming_migrate(
    start_worker, empty_database
):
    enqueue("test.ok")
    before = snapshot()

    worker = start_worker(
        "--drain",
        DJANGO_SETTINGS_MODULE="tests.unmigrated_settings",
        INTENTS_TEST_UNMIGRATED=empty_database,
    )

    assert_refused_before_migrate(worker, "no table 'django_intents_intent' in database 'default'")
    assert snapshot() == before


@pytest.mark.skipif(
    connection.vendor != "sqlite", reason="only SQLite creates a database on connect"
)
def test_workers_before_migrate_on_sqlite_leave_no_empty_database_file(start_worker, tmp_path):
    enqueue("test.ok")
    before = snapshot()
    missing = tmp_path / "not-yet-migrated.sqlite3"

    worker = start_worker(
        DJANGO_SETTINGS_MODULE="tests.unmigrated_settings", INTENTS_TEST_UNMIGRATED=str(missing)
    )

    assert_refused_before_migrate(worker, f"database file {missing} not found")
    assert list(tmp_path.iterdir()) == []
    assert snapshot() == before


# -- --until-empty and --timeout -----------------------------------------------------


def test_until_empty_waits_for_scheduled_retries_and_runs_them(start_worker):
    soon = enqueue("test.ok", "soon", next_at=timezone.now() + timedelta(seconds=2))
    flaky = enqueue("test.fail", payload={"n": 1})  # retried once after ~2 s, then given up
    started = time.monotonic()

    worker = start_worker("--until-empty", "--timeout", "30", intents={"MAX_ATTEMPTS": 2})
    worker.assert_clean_exit(timeout=40)

    assert time.monotonic() - started > 1.0
    assert (row(soon).state, row(soon).attempts) == (Intent.State.COMPLETED, 1)
    assert notes(soon) == ["ok 1"]
    gave_up = row(flaky)
    assert (gave_up.state, gave_up.attempts) == (Intent.State.CANCELLED, 2)
    assert gave_up.last_error == "ValueError: boom 1"
    # The log's last lines: drained, then stopped (the outcomes table follows on stdout).
    logged = [line for line in worker.log.splitlines() if " django_intents." in line]
    assert "is pending or running" in logged[-2], worker.log
    assert not Intent.objects.pending().exists()


def test_until_empty_past_its_timeout_stops_and_exits_1_naming_what_is_left(start_worker):
    failing = enqueue("test.fail", payload={"n": 1})  # retried for ever
    later = enqueue("test.ok", "later", next_at=timezone.now() + timedelta(hours=1))
    stuck = enqueue("test.sleepy", payload={"on_cancel": "ignore"})
    untouched = [r for r in snapshot() if r[0] == later]

    worker = start_worker("--until-empty", "--timeout", "2", "--grace", "0.5", *SHORT)
    code = worker.wait(30)

    assert code == 1, worker.log
    retried = row(failing)
    assert (retried.state, retried.claim_token, retried.last_error) == (
        Intent.State.PENDING,
        "",
        "ValueError: boom 1",
    )
    assert retried.attempts >= 1
    released = row(stuck)
    assert (released.state, released.attempts, released.claim_token) == ("pending", 1, "")
    assert [r for r in snapshot() if r[0] == later] == untouched
    [error] = [line for line in worker.log.splitlines() if " ERROR " in line]
    assert error.endswith(
        "timed out after 2 s with 3 intent(s) of the pool's kinds still pending or running: "
        "test.fail (1 pending, 0 running), test.ok (1 pending, 0 running), "
        "test.sleepy (1 pending, 0 running)"
    ), worker.log
    assert "timeout of 2 s reached before the drain ended; stopping" in worker.log


def test_drain_past_its_timeout_releases_what_runs_and_exits_1(start_worker):
    stuck = enqueue("test.sleepy", payload={"on_cancel": "ignore"})
    before = server_now()

    worker = start_worker("--drain", "--timeout", "1", "--grace", "0.3", *SHORT)
    code = worker.wait(30)

    assert code == 1, worker.log
    assert_due_now_and_unclaimed(stuck, before)
    assert row(stuck).attempts == 1
    assert "test.sleepy (1 pending, 0 running)" in worker.log
