"""Every outcome visible: the drain's table, the summaries, tracebacks, progress displays.

Pools here are real (in this process, or ``run_intent_workers`` as a
subprocess); the counts they show are checked against the rows afterwards.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_intents import Retry, Stop
from django_intents.management.progress import Progress
from django_intents.models import Intent
from django_intents.rules.validation import MAX_TRACEBACK_LENGTH, traceback_text
from django_intents.worker.housekeeping import Housekeeping
from django_intents.worker.pool import WorkerPool
from django_intents.worker.tally import COLUMNS, Tally

from .conftest import external_kinds, intents, row
from .workerutil import ROOT, Worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("o.ok", "o.fail", "o.stop", "o.snooze", "o.other")


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(*KINDS):
        yield


def pool(handlers: dict[str, Any], **kwargs: Any) -> WorkerPool:
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("poll_interval", 0.05)
    return WorkerPool(handlers=handlers, handle_signals=False, **kwargs)


def enqueue(kind: str, n: int = 1) -> list[str]:
    return [Intent.objects.enqueue(kind, f"event-{i}", "target") for i in range(n)]


def ok(intent: Intent, attempt: Any) -> None:
    pass


def fail(intent: Intent, attempt: Any) -> None:
    raise ValueError(f"boom for {intent.event_id}")


def stop(intent: Intent, attempt: Any) -> None:
    raise Stop("gone")


def snooze(intent: Intent, attempt: Any) -> None:
    raise Retry(after=timedelta(hours=1), reason="later")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- what the pool counted -------------------------------------------------------------


def test_a_drain_counts_each_outcome_per_kind_as_the_rows_ended(caplog):
    caplog.set_level(logging.INFO, logger="django_intents")
    done = enqueue("o.ok", 5)
    (retried,) = enqueue("o.fail")
    (stopped,) = enqueue("o.stop")
    (snoozed,) = enqueue("o.snooze")
    (exhausted,) = enqueue("o.other")
    Intent.objects.filter(pk=exhausted).update(attempts=4)  # its next failure is the last
    handlers = {"o.ok": ok, "o.fail": fail, "o.stop": stop, "o.snooze": snooze, "o.other": fail}

    with override_settings(INTENTS=intents(MAX_ATTEMPTS=5)):
        running = pool(handlers, drain=True)
        assert running.run() == 0

    assert all(row(id).state == Intent.State.COMPLETED for id in done)
    assert row(retried).state == Intent.State.PENDING
    assert row(stopped).state == Intent.State.CANCELLED
    assert row(snoozed).snoozes == 1
    assert row(exhausted).state == Intent.State.CANCELLED
    totals = running.outcomes.totals()
    assert dict(totals) == {"completed": 5, "retried": 1, "cancelled": 2, "snoozed": 1}
    table = running.outcomes.table().splitlines()
    assert table[0].split()[:7] == ["kind", *COLUMNS[:5], "timed"]
    cells = {line.split()[0]: line.split()[1:] for line in table[1:-1]}
    assert cells["o.ok"] == ["5", "0", "0", "0", "0", "0"]
    assert cells["o.fail"] == ["0", "1", "0", "0", "0", "0"]
    assert cells["o.other"] == ["0", "0", "0", "1", "0", "0"]
    assert cells["o.stop"] == ["0", "0", "0", "1", "0", "0"]
    assert cells["o.snooze"] == ["0", "0", "1", "0", "0", "0"]
    assert cells["total"] == ["5", "1", "1", "2", "0", "0"]
    assert re.fullmatch(r"9 attempt\(s\) in [\d.]+ s: [\d.]+ intents/s", table[-1])
    # The last line of the pool says it at default verbosity, rate included.
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopped")][-1]
    assert re.fullmatch(
        r"stopped: 5 completed, 1 retried, 1 snoozed, 2 cancelled, 0 released, 0 timed out "
        r"in [\d.]+ s \([\d.]+/s\)",
        last,
    )
    assert caplog.records[-1].levelno == logging.INFO


def test_a_result_dropped_for_a_lost_claim_counts_as_released():
    def lost(intent: Intent, attempt: Any) -> None:
        if intent.attempts == 1:  # an administrator acts while the handler runs
            assert Intent.objects.retry_now(intent.id)

    (id,) = enqueue("o.ok")
    running = pool({"o.ok": lost}, drain=True)
    assert running.run() == 0
    assert running.outcomes.totals()["released"] >= 1
    assert row(id).state == Intent.State.COMPLETED  # its second attempt, after the release


def test_the_summary_interval_is_validated():
    with pytest.raises(ValueError, match="report_interval"):
        Housekeeping(report_interval=0, kinds=[], using="default", tally=Tally())
    with pytest.raises(CommandError, match="summary-interval"):
        call_command("run_intent_workers", "--summary-interval", "0")


# -- tracebacks ---------------------------------------------------------------------------


def test_a_failure_keeps_its_traceback_with_its_error_and_a_later_success_keeps_both():
    def fail_once(intent: Intent, attempt: Any) -> None:
        if intent.attempts == 1:
            raise ValueError("first try")

    (id,) = enqueue("o.fail")
    assert pool({"o.fail": fail_once}, drain=True).run() == 0
    failed = row(id)
    assert failed.last_error == "ValueError: first try"
    assert failed.last_traceback.startswith("Traceback (most recent call last):")
    assert "in fail_once" in failed.last_traceback
    assert failed.last_traceback.rstrip().endswith("ValueError: first try")

    Intent.objects.retry_now(id)
    assert pool({"o.fail": fail_once}, drain=True).run() == 0
    done = row(id)
    # As last_error: the last failure's, kept after the success (SPEC §4).
    assert (done.state, done.last_error) == (Intent.State.COMPLETED, "ValueError: first try")
    assert done.last_traceback == failed.last_traceback


def test_an_error_without_a_traceback_replaces_the_last_one():
    (id,) = enqueue("o.stop")
    Intent.objects.filter(pk=id).update(last_error="ValueError: old", last_traceback="old trace")
    assert pool({"o.stop": stop}, drain=True).run() == 0
    stopped = row(id)
    assert (stopped.last_error, stopped.last_traceback) == ("gone", "")


def test_a_long_traceback_keeps_its_tail():
    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("x" * 9000 + " the end")
        deep(n - 1)

    try:
        deep(2)
    except RuntimeError as exc:
        text = traceback_text(exc)
    assert len(text) == MAX_TRACEBACK_LENGTH
    assert text.startswith("…") and text.endswith(" the end\n")
    assert traceback_text("a\x00b") == "a\\x00b"

    def raise_deep(intent: Intent, attempt: Any) -> None:
        deep(2)

    (id,) = enqueue("o.fail")
    assert pool({"o.fail": raise_deep}, drain=True).run() == 0
    kept = row(id).last_traceback
    assert len(kept) == MAX_TRACEBACK_LENGTH and kept.endswith(" the end\n")


def test_the_log_shows_a_traceback_once_per_kind_and_exception_type(caplog):
    def mixed(intent: Intent, attempt: Any) -> None:
        if intent.event_id == "event-3":
            raise KeyError("other")
        raise ValueError(f"boom for {intent.event_id}")

    enqueue("o.fail", 4)
    enqueue("o.other", 1)
    caplog.set_level(logging.WARNING, logger="django_intents")  # the default verbosity
    assert pool({"o.fail": mixed, "o.other": fail}, drain=True, workers=1).run() == 0

    lines = [line for line in warnings(caplog) if ": failed: " in line]
    assert len(lines) == 5
    with_trace = [line for line in lines if "Traceback (most recent call last):" in line]
    # o.fail's ValueError, o.fail's KeyError, o.other's ValueError: once each.
    assert len(with_trace) == 3
    assert {re.search(r"^o\.\w+", line)[0] for line in with_trace} == {"o.fail", "o.other"}
    assert any("KeyError: 'other'" in line.splitlines()[-1] for line in with_trace)
    reminders = [line for line in lines if line.endswith(" (traceback logged above)")]
    assert len(reminders) == 2
    assert all(line.count("\n") == 0 for line in reminders)


def test_the_admin_detail_page_shows_the_traceback_escaped(admin_client):
    (id,) = enqueue("o.fail")
    trace = 'Traceback (most recent call last):\n  File "<x>"\nValueError: <b>bold</b>\n'
    Intent.objects.filter(pk=id).update(last_error="ValueError: <b>bold</b>", last_traceback=trace)
    html = admin_client.get(reverse("admin:django_intents_intent_change", args=[id])).content
    page = html.decode()
    assert '<pre class="intents-pre">Traceback (most recent call last):\n' in page
    assert "ValueError: &lt;b&gt;bold&lt;/b&gt;\n</pre>" in page
    assert "<b>bold</b>" not in page


# -- progress -----------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal_and_writes_plain_lines_elsewhere():
    terminal = Terminal()
    bar = Progress(description="draining", unit="intents", stream=terminal, total=10)
    for _ in range(4):
        bar.advance()
    bar.close()
    assert bar.tty and "\r" in terminal.getvalue() and "4/10" in terminal.getvalue()

    lines: list[str] = []
    plain = Progress(
        description="draining", unit="intents", stream=io.StringIO(), total=10, every=0.0,
        write=lines.append,
    )  # fmt: skip
    plain.advance(4)
    plain.close()
    assert not plain.tty
    assert re.fullmatch(r"draining: 4/10 intents, [\d.]+/s, about \d+ s left", lines[-1])


def test_prune_intents_shows_a_bar_only_on_a_terminal():
    def old_completed(n: int) -> None:
        ids = enqueue("o.ok", n)
        old = timezone.now() - timedelta(days=3)
        Intent.objects.filter(pk__in=ids).update(state=Intent.State.COMPLETED, updated_at=old)

    retention = intents(RETENTION={"completed": {"delete": timedelta(days=1)}})
    old_completed(3)
    terminal = Terminal()
    with override_settings(INTENTS=retention):
        call_command("prune_intents", "--batch-size", "2", stdout=terminal)
    assert "pruning" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert "completed: 3 deleted" in terminal.getvalue()

    old_completed(3)
    plain = io.StringIO()
    with override_settings(INTENTS=retention):
        call_command("prune_intents", "--batch-size", "2", stdout=plain)
    assert plain.getvalue() == "completed: 3 deleted\n"  # done within 10 s: no progress line


def test_a_drain_on_a_terminal_shows_progress_against_the_due_backlog(monkeypatch):
    enqueue("test.ok", 3)
    terminal = Terminal()
    call_command("run_intent_workers", "--drain", "--kinds", "test.ok", stdout=terminal)
    out = terminal.getvalue()
    assert "draining" in out and "3/3" in out and "\r" in out
    assert re.search(r"^test\.ok +3 +0 +0 +0 +0 +0$", out, re.MULTILINE)


# -- the table of a real process -------------------------------------------------------


def test_run_intent_workers_drain_prints_the_table_on_stdout_and_says_so_in_its_log():
    for i in range(5):
        Intent.objects.enqueue("test.ok", f"ok-{i}", "https://example.com/hook")
    failing = Intent.objects.enqueue("test.fail", "f", "https://example.com/hook", {"n": 1})
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_intent_workers", "--drain"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            "INTENTS_TEST_INTENTS": json.dumps({}),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out, log = done.stdout, done.stderr
    assert re.search(r"^test\.ok +5 +0 +0 +0 +0 +0$", out, re.MULTILINE), out
    assert re.search(r"^test\.fail +0 +1 +0 +0 +0 +0$", out, re.MULTILINE), out
    assert re.search(r"^total +5 +1 +0 +0 +0 +0$", out, re.MULTILINE), out
    assert re.search(r"^6 attempt\(s\) in [\d.]+ s: [\d.]+ intents/s$", out, re.MULTILINE), out
    assert "\r" not in out  # not a terminal: no bar
    assert "stopped: 5 completed, 1 retried" in log
    assert "Traceback (most recent call last):" in log and "ValueError: boom 1" in log
    assert row(failing).last_traceback.rstrip().endswith("ValueError: boom 1")
    assert Intent.objects.filter(kind="test.ok", state=Intent.State.COMPLETED).count() == 5


def test_with_debug_on_every_failure_logs_its_traceback(caplog):
    enqueue("o.fail", 3)
    caplog.set_level(logging.DEBUG, logger="django_intents")  # -v 2
    assert pool({"o.fail": fail}, drain=True).run() == 0
    lines = [line for line in warnings(caplog) if ": failed: " in line]
    assert len(lines) == 3
    assert all("Traceback (most recent call last):" in line for line in lines)


def test_a_service_pool_logs_its_summary_every_interval_and_once_more_at_sigterm():
    """Issue 40: a pool that runs as a service (no ``--drain``) says how it goes while it
    runs, not only once a minute, and its last line counts everything it did."""
    done = [
        Intent.objects.enqueue("test.ok", f"ok-{i}", "https://example.com/hook") for i in range(3)
    ]
    failing = Intent.objects.enqueue("test.fail", "f", "https://example.com/hook", {"n": 1})
    Intent.objects.filter(pk=failing).update(attempts=5)  # its retry backs off a minute
    worker = Worker(["--summary-interval", "0.5", "--workers", "2"], {}, {})
    try:
        interval = r"(\d+) attempt\(s\) finished in the last [\d.]+ s \([\d.]+/s\): (\d+) completed, (\d+) retried"

        def counted() -> tuple[int, int]:
            lines = re.findall(interval, worker.log)
            return sum(int(m[1]) for m in lines), sum(int(m[2]) for m in lines)

        wait_for(lambda: counted() == (3, 1), "interval lines counting 3 completed and 1 retried")
        worker.signal(signal.SIGTERM)
        worker.assert_clean_exit(timeout=20)
        last = worker.log.strip().splitlines()[-1]
        assert re.search(
            r"INFO django_intents.worker: stopped: 3 completed, 1 retried, 0 snoozed, "
            r"0 cancelled, 0 released, 0 timed out in [\d.]+ s \([\d.]+/s\)$",
            last,
        ), worker.log
    finally:
        worker.cleanup()
    assert all(row(id).state == Intent.State.COMPLETED for id in done)
    retried = row(failing)
    assert (retried.state, retried.attempts, retried.last_error) == (
        Intent.State.PENDING,
        6,
        "ValueError: boom 1",
    )
