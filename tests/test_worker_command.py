"""``run_intent_workers`` as an adapter: options are validated and reach the pool as given.

The pool is replaced by a recorder here; test_worker_process.py runs the real one.
The command looks for the intents table before it builds the pool, hence the
database.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.test import override_settings

from django_intents.management.commands import run_intent_workers as command
from django_intents.observability import metrics
from django_intents.worker.tally import Tally
from tests.testapp import handlers as test_handlers

pytestmark = pytest.mark.django_db


class FakePool:
    instances: list[FakePool] = []
    status = 0

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.ran = False
        self.outcomes = Tally()
        FakePool.instances.append(self)

    def run(self) -> int:
        self.ran = True
        return self.status

    def healthy(self) -> bool:
        return True


@pytest.fixture
def fake_pool(monkeypatch) -> type[FakePool]:
    FakePool.instances = []
    FakePool.status = 0
    monkeypatch.setattr(command, "WorkerPool", FakePool)
    # The command sets up logging for its process; keep that out of other tests.
    logger = logging.getLogger("django_intents")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    return FakePool


def run(*args: str) -> FakePool:
    call_command("run_intent_workers", *args)
    return FakePool.instances[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "at least 1"),
        (["--workers", "two"], "not a whole number"),
        (["--concurrency", "0"], "at least 1"),
        (["--concurrency", "1.5"], "not a whole number"),
        (["--lease", "-1"], "seconds > 0"),
        (["--lease", "inf"], "seconds > 0"),
        (["--lease", "nan"], "seconds > 0"),
        (["--renew", "0"], "seconds > 0"),
        (["--grace", "-0.5"], "seconds >= 0"),
        (["--db-error-timeout", "0"], "seconds > 0"),
        (["--kinds", " , "], "comma-separated"),
        (["--kinds", "x" * 101], "kind is 101 characters"),
        (["--metrics-port", "70000"], "port number"),
        (["--metrics-port", "http"], "not a port number"),
        (["--until-empty", "--timeout", "0"], "--timeout: must be a number of seconds > 0"),
        (["--drain", "--timeout", "-3"], "--timeout: must be a number of seconds > 0"),
        (["--until-empty", "--timeout", "soon"], "--timeout: 'soon' is not a number of seconds"),
        (["--until-empty", "--timeout", "inf"], "--timeout: must be a number of seconds > 0"),
        (["--timeout-per-attempt", "0"], "--timeout-per-attempt: must be a number of seconds > 0"),
        (["--timeout-per-attempt", "-1"], "--timeout-per-attempt: must be a number of seconds"),
        (["--timeout-per-attempt", "inf"], "--timeout-per-attempt: must be a number of seconds"),
        (["--timeout-per-attempt", "nan"], "--timeout-per-attempt: must be a number of seconds"),
        (["--timeout-per-attempt", "1m"], "--timeout-per-attempt: '1m' is not a number of seconds"),
    ],
)
def test_bad_option_values_are_refused_before_anything_runs(fake_pool, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("run_intent_workers", *args)
    assert fake_pool.instances == []


def test_renew_not_shorter_than_the_lease_is_refused(fake_pool):
    with pytest.raises(CommandError, match="must be shorter than the lease"):
        call_command("run_intent_workers", "--lease", "3", "--renew", "3")
    assert fake_pool.instances == []


def test_a_kind_without_a_handler_is_refused_naming_it(fake_pool):
    with pytest.raises(CommandError, match="no handler for kind.s. test.nobody"):
        call_command("run_intent_workers", "--kinds", "test.ok,test.nobody")


@override_settings(INTENTS={"HANDLERS": {"test.ok": "tests.testapp.handlers.dotted"}})
def test_a_kind_registered_twice_is_refused_naming_both(fake_pool):
    with pytest.raises(CommandError) as caught:
        call_command("run_intent_workers")
    assert "tests.testapp.handlers.ok" in str(caught.value)
    assert "tests.testapp.handlers.dotted" in str(caught.value)


def test_no_handlers_at_all_is_refused(fake_pool, monkeypatch):
    monkeypatch.setattr(command, "discover", lambda: {})
    with pytest.raises(CommandError, match="no handlers"):
        call_command("run_intent_workers")


def test_options_reach_the_pool(fake_pool):
    pool = run(
        "--workers", "3", "--concurrency", "250", "--kinds", "test.ok,test.stop", "--lease", "6",
        "--renew", "1.5", "--drain", "--grace", "0", "--db-error-timeout", "9",
        "--summary-interval", "30",
        "--timeout-per-attempt", "2.5",
    )  # fmt: skip
    assert pool.ran
    assert pool.kwargs["handlers"] == {"test.ok": test_handlers.ok, "test.stop": test_handlers.stop}
    assert {key: value for key, value in pool.kwargs.items() if key != "handlers"} == {
        "workers": 3,
        "concurrency": 250,
        "lease": 6.0,
        "renew": 1.5,
        "grace": 0.0,
        "drain": True,
        "until_empty": False,
        "timeout": None,
        "timeout_per_attempt": 2.5,
        "db_error_timeout": 9.0,
        "report_interval": 30.0,
        "using": "default",
        "handle_signals": True,  # one database: the pool takes the signals itself
    }


def test_until_empty_and_timeout_reach_the_pool(fake_pool):
    pool = run("--until-empty", "--timeout", "2.5")
    assert (pool.kwargs["until_empty"], pool.kwargs["timeout"]) == (True, 2.5)
    assert pool.kwargs["drain"] is False
    assert run("--drain", "--timeout", "7").kwargs["timeout"] == 7.0


def test_timeout_without_drain_or_until_empty_is_refused(fake_pool):
    with pytest.raises(CommandError, match="--timeout bounds --drain or --until-empty"):
        call_command("run_intent_workers", "--timeout", "5")
    assert fake_pool.instances == []


def test_help_says_what_drain_and_until_empty_wait_for(capsys):
    with pytest.raises(SystemExit):
        call_command("run_intent_workers", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "intents not due yet (retries backing off, next_at in the future) are left" in text
    assert "no intent of the pool's kinds is pending or running, scheduled retries" in text
    assert "with --drain or --until-empty: if not done after this long" in text


@override_settings(INTENTS={"LEASE": 60, "RENEW": 5})
def test_defaults_come_from_settings_and_renew_follows_a_given_lease(fake_pool):
    defaults = run().kwargs
    assert (defaults["workers"], defaults["lease"], defaults["renew"]) == (None, 60, 5)
    assert (defaults["grace"], defaults["drain"], defaults["db_error_timeout"]) == (
        10.0,
        False,
        None,
    )
    assert set(defaults["handlers"]) >= {"test.ok", "test.sleepy"}
    # A shorter lease on the command line must not keep the settings' renewal period.
    assert run("--lease", "3").kwargs["renew"] == 1.0


def test_a_failed_run_exits_with_its_status(fake_pool):
    fake_pool.status = 1
    with pytest.raises(SystemExit) as caught:
        call_command("run_intent_workers")
    assert caught.value.code == 1


def test_metrics_port_serves_the_pools_health_and_closes_after_the_run(fake_pool, monkeypatch):
    served: list[tuple[Any, ...]] = []

    class Server:
        port = 9100
        closed = False

        def close(self) -> None:
            Server.closed = True

    def serve(addr: str, port: int, healthy: Any) -> Server:
        served.append((addr, port, healthy))
        return Server()

    monkeypatch.setattr(metrics, "serve", serve)

    pool = run("--metrics-port", "9100", "--metrics-addr", "0.0.0.0")  # noqa: S104

    assert served == [("0.0.0.0", 9100, pool.healthy)]  # noqa: S104
    assert Server.closed


def test_without_metrics_port_nothing_is_served(fake_pool, monkeypatch):
    monkeypatch.setattr(metrics, "serve", lambda *args: pytest.fail("served metrics"))
    assert run().ran


def test_a_missing_intents_table_is_refused_naming_migrate(fake_pool, monkeypatch):
    monkeypatch.setattr(connection.introspection, "table_names", lambda *a, **k: ["other"])
    with pytest.raises(CommandError) as refused:
        call_command("run_intent_workers", "--drain")
    assert str(refused.value) == (
        "the intents table does not exist: run `manage.py migrate` "
        "(no table 'django_intents_intent' in database 'default')"
    )
    assert fake_pool.instances == []


def test_an_unreachable_database_is_left_to_the_pool_to_ride_out(fake_pool, monkeypatch):
    def unreachable(*args: Any, **kwargs: Any) -> list[str]:
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection.introspection, "table_names", unreachable)
    assert run("--drain").ran
