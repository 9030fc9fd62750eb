"""Redrive with real processes: worker pools drain what a redrive made pending, an idle
pool on PostgreSQL is woken by it, and the command draws its progress bar on a terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import time

import pytest
from django.core.management import call_command
from django.db import connection

from django_intents.models import Intent

from .conftest import row
from .test_worker_process import enqueue, is_state, start_worker  # noqa: F401 - the fixture
from .workerutil import ROOT, wait_for


def test_workers_drain_redriven_intents_with_a_fresh_budget(start_worker):  # noqa: F811
    """Two failing intents use their two attempts in a first pool and are cancelled;
    an operator cancels a third before it runs. Redriven, the failing ones get two
    more attempts in a second pool (one retried after its backoff, then cancelled
    again), and the third completes."""
    failing = [enqueue("test.fail", f"f{n}", {"n": n}) for n in range(2)]
    held = enqueue("test.ok", "held")
    assert Intent.objects.cancel(held)
    limits = {"MAX_ATTEMPTS": 2}
    start_worker("--until-empty", "--kinds", "test.fail", intents=limits).assert_clean_exit(30)
    for id in failing:  # noqa: A001
        first = row(id)
        assert (first.state, first.attempts, first.written_off) == ("cancelled", 2, 0)

    out = io.StringIO()
    call_command("intents_redrive", stdout=out)
    assert out.getvalue() == "Redrove 3 cancelled intents: pending again, due now.\n"

    worker = start_worker("--until-empty", intents=limits)
    worker.assert_clean_exit(timeout=30)
    for n, id in enumerate(failing):  # noqa: A001
        again = row(id)
        assert (again.state, again.attempts, again.written_off) == ("cancelled", 4, 2)
        assert again.last_error == f"ValueError: boom {n}"
        assert (again.claim_token, again.claim_until) == ("", None)
    done = row(held)
    assert (done.state, done.attempts, done.written_off) == ("completed", 1, 0)
    # Each failing intent was retried once after the redrive: a fresh budget, not
    # the last attempt of the old one.
    assert worker.log.count("ValueError: boom 0; retry in") == 1, worker.log
    assert worker.log.count("MAX_ATTEMPTS (2) reached") == 2, worker.log


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_an_idle_pool_on_postgresql_is_woken_by_a_redrive(start_worker):  # noqa: F811
    id = enqueue("test.ok")  # noqa: A001
    assert Intent.objects.cancel(id)
    worker = start_worker("--kinds", "test.ok", intents={"POLL_INTERVAL": 60})
    wait_for(lambda: "listening for new intents" in worker.log, "the pool to LISTEN")
    time.sleep(1.0)  # past the first claim: from here on only a notification wakes it

    assert Intent.objects.redrive(kind="test.ok") == 1

    try:
        wait_for(lambda: is_state(id, "completed"), "the notified pool", timeout=20)
    except AssertionError as failure:
        raise AssertionError(
            f"{failure}; the row: {vars(row(id))}; the pool said:\n{worker.log}"
        ) from None
    worker.signal(15)
    worker.assert_clean_exit(timeout=15)


@pytest.mark.django_db(transaction=True)
def test_on_a_terminal_the_command_draws_a_progress_bar():
    for n in range(3):
        id = enqueue("test.ok", f"t{n}")  # noqa: A001
        assert Intent.objects.cancel(id)
    primary, secondary = pty.openpty()
    # A terminal 100 columns wide: a new pty has none, and tqdm draws to its width.
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "intents_redrive"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings"},
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.STDOUT,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(30) == 0
    output = b"".join(chunks).decode(errors="replace")
    assert "redriving: 100%" in output and "3/3" in output, output
    assert "Redrove 3 cancelled intents: pending again, due now." in output
    assert set(Intent.objects.values_list("state", flat=True)) == {"pending"}
