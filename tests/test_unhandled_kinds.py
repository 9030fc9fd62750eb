"""Due intents of a kind nothing runs: health fails on them, the worker start names them.

Enqueue refuses such kinds now, but intents can predate that (an older
release, a handler since removed): here they are written while the kind is
declared external, and looked at once it no longer is.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from django_intents.models import Intent
from django_intents.worker.pool import WorkerPool
from django_intents.worker.startup import unhandled_due

from .conftest import external_kinds, snapshot
from .test_health import health

pytestmark = pytest.mark.django_db(transaction=True)


def orphan(kind: str, event_id: str, seconds_ago: float = 5) -> str:
    """Enqueue an intent of ``kind`` while it is declared, so nothing runs it afterwards."""
    when = timezone.now() - timedelta(seconds=seconds_ago)
    with external_kinds(kind):
        return Intent.objects.enqueue(kind, event_id, "t", next_at=when, now=when)


def test_health_fails_naming_due_kinds_that_no_handler_runs(capsys):
    orphan("webhok", "a")
    orphan("webhok", "b")
    orphan("legacy.sync", "c")
    Intent.objects.enqueue("webhook", "fine", "t")
    before = snapshot()
    code, out, err = health(capsys=capsys)
    assert code == 1
    assert out == ""
    assert "'legacy.sync' (1 due), 'webhok' (2 due)" in err
    assert "INTENTS['EXTERNAL_KINDS']" in err
    assert snapshot() == before


def test_health_ignores_an_unhandled_kind_that_is_not_due_yet(capsys):
    orphan("webhok", "later", seconds_ago=-3600)
    code, out, _ = health(capsys=capsys)
    assert code == 0
    assert out.startswith("ok: nothing is due")


def test_health_accepts_due_intents_of_an_external_kind(capsys):
    orphan("billing.invoice", "a")
    with external_kinds("billing.invoice"):
        code, out, _ = health(capsys=capsys)
    assert code == 0
    assert "kind 'billing.invoice'" in out


def drain_test_ok_only(caplog) -> None:
    """Drain a pool that runs only ``test.ok``, capturing what it logs."""
    pool = WorkerPool(
        handlers={"test.ok": lambda intent, attempt: None},
        workers=1,
        poll_interval=0.05,
        drain=True,
        handle_signals=False,
    )
    with caplog.at_level(logging.INFO, logger="django_intents.worker"):
        assert pool.run() == 0


def test_the_worker_start_warns_naming_due_kinds_that_no_handler_runs(caplog):
    orphan("webhok", "a")
    ok = Intent.objects.enqueue("test.ok", "b", "t")
    drain_test_ok_only(caplog)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "no handler in this project runs: webhok (1 due)" in warning.getMessage()
    assert "test.ok" not in warning.getMessage()
    assert Intent.objects.get(pk=ok).state == Intent.State.COMPLETED


def test_the_worker_start_does_not_warn_about_kinds_other_pools_run(caplog):
    # test.sleepy has a handler in this project; this pool only runs test.ok.
    Intent.objects.enqueue("test.sleepy", "a", "t", {"seconds": 0})
    drain_test_ok_only(caplog)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_start_up_warning_counts_only_the_kinds_nothing_runs(django_assert_max_num_queries):
    # Many due intents of handled kinds, two orphan kinds (one not due yet).
    Intent.objects.enqueue_many(
        {"kind": kind, "event_id": f"{kind}-{n}", "target": "t"}
        for kind in ("test.ok", "test.sleepy")
        for n in range(30)
    )
    orphan("webhok", "a")
    orphan("webhok", "b")
    orphan("legacy.sync", "later", seconds_ago=-3600)
    before = snapshot()
    # The clock, one probe per kind and one past the last, one count per unknown kind.
    with django_assert_max_num_queries(1 + 5 + 2) as captured:
        assert unhandled_due("default") == {"webhok": 2}
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 2
    assert not any("test.ok" in sql or "test.sleepy" in sql for sql in counts)
    assert snapshot() == before
