"""Health: ``manage.py intents_health`` and the worker port's ``/healthz``.

The command is driven through Django's real command-line entry point, so the
exit status asserted here is the one a container probe or cron job sees. That
entry point closes the database connections when the command ends, so those
tests commit their rows (``transaction=True``) instead of living in a test
transaction the close would throw away.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command, execute_from_command_line
from django.core.management.base import CommandError
from django.utils import timezone

from django_intents.models import Intent
from django_intents.observability import metrics

from .conftest import snapshot


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def health(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``manage.py intents_health`` as the shell would; return (exit status, out, err)."""
    try:
        execute_from_command_line(["manage.py", "intents_health", *args])
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# -- intents_health ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_health_passes_on_an_empty_queue(capsys):
    code, out, _ = health(capsys=capsys)
    assert code == 0
    assert out.strip() == "ok: nothing is due (0 pending, max age 300s)"


@pytest.mark.django_db(transaction=True)
def test_health_fails_when_a_pending_intent_waited_longer_than_the_default(capsys):
    Intent.objects.enqueue("webhook", "stuck", "t", next_at=ago(400), now=ago(400))
    Intent.objects.enqueue("push", "fresh", "t", next_at=ago(10), now=ago(10))
    code, out, err = health(capsys=capsys)
    assert code == 1
    assert out == ""
    assert "stuck: oldest due intent (kind 'webhook') has waited 40" in err
    assert "more than --max-age 300s" in err
    assert "2 pending" in err


def running(kind: str, event: str, due_ago: float, claimed_ago: float) -> str:
    """An intent due ``due_ago`` s ago, claimed ``claimed_ago`` s ago and renewed just now."""
    id = Intent.objects.enqueue(kind, event, "t", next_at=ago(due_ago), now=ago(due_ago))
    claim = Intent.objects.claim(now=ago(claimed_ago), lease=60, kinds=[kind])
    assert claim is not None and claim.id == id
    assert Intent.objects.renew(id, claim.claim_token, lease=60)  # the lease is alive
    return id


@pytest.mark.django_db(transaction=True)
def test_health_fails_naming_the_attempts_running_longer_than_max_running(capsys):
    hung = running("webhook", "hung", due_ago=1300, claimed_ago=1200)
    slow = running("push", "slow", due_ago=700, claimed_ago=700)
    running("job", "fresh", due_ago=30, claimed_ago=30)
    code, out, err = health("--max-running", "600", capsys=capsys)
    assert code == 1
    assert out == ""
    assert "running too long: 2 attempt(s) have run more than --max-running 600s" in err
    assert "of kind(s) 'push' (1), 'webhook' (1)" in err
    # Longest first, each with its kind and how long.
    assert err.index(hung) < err.index(slow)
    assert f"{hung} ('webhook', 130" in err
    assert f"{slow} ('push', 70" in err
    assert "fresh" not in err and "'job'" not in err


@pytest.mark.django_db(transaction=True)
def test_health_passes_when_every_attempt_is_within_max_running(capsys):
    running("webhook", "slow", due_ago=200, claimed_ago=190)
    code, out, err = health("--max-running", "600", capsys=capsys)
    assert code == 0, err
    first, second = out.splitlines()
    assert first.startswith("ok: the longest attempt (kind 'webhook') has run 20")
    assert first.endswith("(max running 600s)")
    assert second.startswith("ok: nothing is due")


@pytest.mark.django_db(transaction=True)
def test_health_without_max_running_ignores_long_attempts(capsys):
    running("webhook", "hung", due_ago=5000, claimed_ago=5000)
    code, out, err = health(capsys=capsys)
    assert code == 0, err
    assert out.strip() == "ok: nothing is due (0 pending, max age 300s)"
    code, out, _ = health("--max-running", "0", capsys=capsys)
    assert code == 1


@pytest.mark.django_db(transaction=True)
def test_health_max_running_on_an_idle_queue(capsys):
    code, out, _ = health("--max-running", "60", capsys=capsys)
    assert code == 0
    assert out.splitlines()[0] == "ok: nothing is running (max running 60s)"


@pytest.mark.django_db(transaction=True)
def test_health_passes_when_the_oldest_due_intent_is_within_max_age(capsys):
    Intent.objects.enqueue("webhook", "stuck", "t", next_at=ago(400), now=ago(400))
    code, out, err = health("--max-age", "900", capsys=capsys)
    assert code == 0
    assert err == ""
    assert out.startswith("ok: oldest due intent (kind 'webhook') has waited 40")
    assert out.rstrip().endswith("(max age 900s)")
    assert out.count("\n") == 1


@pytest.mark.django_db(transaction=True)
def test_health_counts_an_expired_lease_from_its_expiry(capsys):
    Intent.objects.enqueue("job", "crashed", "t", next_at=ago(5000), now=ago(5000))
    Intent.objects.claim(now=ago(700), lease=100, kinds=["job"])  # expired 600 s ago
    assert health("--max-age", "650", capsys=capsys)[0] == 0
    code, _, err = health("--max-age", "550", capsys=capsys)
    assert code == 1
    assert "(kind 'job') has waited 60" in err


@pytest.mark.django_db(transaction=True)
def test_health_ignores_scheduled_running_and_finished_intents(capsys):
    Intent.objects.enqueue("webhook", "later", "t", next_at=ago(-3600), now=ago(9000))
    Intent.objects.enqueue("push", "busy", "t", next_at=ago(9000), now=ago(9000))
    Intent.objects.claim(now=ago(1), lease=600, kinds=["push"])
    Intent.objects.enqueue("job", "done", "t", next_at=ago(9000), now=ago(9000))
    done = Intent.objects.claim(now=ago(8000), kinds=["job"])
    Intent.objects.complete(done.id, done.claim_token, now=ago(7999))
    code, out, _ = health("--max-age", "1", capsys=capsys)
    assert code == 0
    assert out.strip() == "ok: nothing is due (1 pending, max age 1s)"


@pytest.mark.django_db
def test_health_as_a_call_raises_command_error_with_exit_status_1():
    Intent.objects.enqueue("webhook", "stuck", "t", next_at=ago(400), now=ago(400))
    with pytest.raises(CommandError) as error:
        call_command("intents_health", max_age=60)
    assert error.value.returncode == 1


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_health_refuses_a_max_age_that_is_not_seconds(value, capsys):
    code, _, err = health("--max-age", value, capsys=capsys)
    assert code == 2
    assert "--max-age" in err


# -- /healthz on the worker's metrics port ------------------------------------------------


def get(port: int, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local http
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:  # an unclosed error response leaks its socket
            return error.code, error.read().decode()


def serving(healthy: Callable[[], bool]) -> metrics.MetricsServer:
    return metrics.serve("127.0.0.1", 0, healthy)


def test_healthz_follows_the_healthy_callable():
    state = {"ok": True}
    server = serving(lambda: state["ok"])
    try:
        assert get(server.port, "/healthz") == (200, "ok\n")
        state["ok"] = False
        assert get(server.port, "/healthz") == (503, "unhealthy\n")
        state["ok"] = True
        assert get(server.port, "/healthz") == (200, "ok\n")
    finally:
        server.close()


def test_healthz_answers_503_when_the_callable_raises(caplog):
    def broken() -> bool:
        raise RuntimeError("pool state unavailable")

    server = serving(broken)
    try:
        assert get(server.port, "/healthz") == (503, "unhealthy\n")
    finally:
        server.close()
    assert "health check raised" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_health_on_a_database_never_migrated_names_migrate_instead_of_a_traceback(
    empty_database,
):
    before = snapshot()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.unmigrated_settings",
        "INTENTS_TEST_UNMIGRATED": empty_database,
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "intents_health"],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "the intents table does not exist: run `manage.py migrate`" in done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot() == before
