"""Retention: ``retention.prune`` and ``manage.py prune_intents`` on every database.

Ages are driven through ``now=``: intents finish at chosen times, so
``updated_at`` (the terminal transition) is known exactly.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_intents.maintenance.retention import prune
from django_intents.models import Intent

from .conftest import T0, intents, row, snapshot

pytestmark = pytest.mark.django_db

TARGET = "https://partner.example/hooks"
DAY = timedelta(days=1)
DEFAULT = {
    "completed": {"compact": 30 * DAY, "delete": 90 * DAY},
    "cancelled": {"compact": 60 * DAY},
}


@pytest.fixture
def retention(settings: Any) -> Any:
    """Set ``INTENTS["RETENTION"]``; ``get_settings()`` is cleared by ``setting_changed``."""

    def apply(value: Any = DEFAULT) -> None:
        settings.INTENTS = intents(RETENTION=value)

    apply()
    return apply


def finished(state: str, age: timedelta, event: str, *, kind: str = "webhook") -> str:
    """An intent that reached ``state`` at ``T0 - age``, with a payload and an error."""
    at = T0 - age
    id = Intent.objects.enqueue(kind, event, TARGET, {"body": "x" * 100}, now=at - DAY)
    claimed = Intent.objects.claim(now=at, kinds=[kind])
    assert claimed is not None and claimed.pk == id
    if state == "completed":
        assert Intent.objects.complete(id, claimed.claim_token, now=at)
        # A completed intent keeps the error of an earlier failed attempt.
        Intent.objects.filter(pk=id).update(last_error="HTTP 502 on attempt 1")
    else:
        assert Intent.objects.cancel_claim(id, claimed.claim_token, "gone for good", now=at)
    return id


def active(state: str, age: timedelta, event: str) -> str:
    """A pending or running intent untouched for ``age``: old, but never prunable."""
    at = T0 - age
    id = Intent.objects.enqueue("job", event, TARGET, {"keep": True}, now=at)
    if state == "running":
        claimed = Intent.objects.claim(now=at, kinds=["job"], lease=60)
        assert claimed is not None and claimed.pk == id
    else:
        Intent.objects.filter(pk=id).update(last_error="HTTP 500", next_at=T0 + DAY)
    return id


def compacted(id: str) -> bool:  # noqa: A002
    intent = row(id)
    return intent.payload is None and intent.last_error == ""


def test_compacts_terminal_intents_older_than_the_window(retention):
    old = finished("completed", 31 * DAY, "old")
    young = finished("completed", 29 * DAY, "young")
    before = row(old)
    report = prune(now=T0)
    assert compacted(old)
    after = row(old)
    assert (after.state, after.updated_at, after.attempts, after.kind, after.event_id) == (
        "completed",
        before.updated_at,
        before.attempts,
        before.kind,
        before.event_id,
    )
    assert row(young).payload == {"body": "x" * 100}
    assert row(young).last_error == "HTTP 502 on attempt 1"
    assert report.compacted == {"completed": 1, "cancelled": 0}
    assert report.deleted == {"completed": 0}
    assert report.finished


def test_deletes_terminal_intents_older_than_the_delete_window(retention):
    gone = finished("completed", 91 * DAY, "gone")
    middle = finished("completed", 45 * DAY, "middle")
    report = prune(now=T0)
    assert not Intent.objects.filter(pk=gone).exists()
    assert compacted(middle)
    assert report.deleted == {"completed": 1}
    assert report.compacted == {"completed": 1, "cancelled": 0}


def test_windows_are_per_state(retention):
    completed = finished("completed", 100 * DAY, "c")
    cancelled = finished("cancelled", 100 * DAY, "x")
    young_cancelled = finished("cancelled", 59 * DAY, "y")
    report = prune(now=T0)
    assert not Intent.objects.filter(pk=completed).exists()
    # cancelled has no delete window: compacted, kept for good.
    assert compacted(cancelled)
    assert row(cancelled).state == "cancelled"
    assert row(young_cancelled).last_error == "gone for good"
    assert report.compacted == {"completed": 0, "cancelled": 1}
    assert report.deleted == {"completed": 1}


def test_a_state_without_retention_is_kept_whole(retention):
    retention({"completed": {"compact": DAY}})
    cancelled = finished("cancelled", 1000 * DAY, "x")
    before = snapshot()
    report = prune(now=T0)
    assert snapshot() == before
    assert compacted(cancelled) is False
    assert report.compacted == {"completed": 0}
    assert report.deleted == {}


def test_never_touches_pending_or_running_intents(retention):
    retention(
        {
            "completed": {"compact": timedelta(0), "delete": timedelta(0)},
            "cancelled": {"compact": timedelta(0), "delete": timedelta(0)},
        }
    )
    pending = active("pending", 5000 * DAY, "p")
    running = active("running", 5000 * DAY, "r")
    done = finished("completed", DAY, "d")
    before = [r for r in snapshot() if r[0] in (pending, running)]
    report = prune(now=T0)
    assert [r for r in snapshot() if r[0] in (pending, running)] == before
    assert not Intent.objects.filter(pk=done).exists()
    assert report.deleted == {"completed": 1, "cancelled": 0}


def test_dry_run_changes_nothing_and_counts_what_a_run_does(retention):
    for i in range(3):
        finished("completed", 100 * DAY, f"old-{i}")
    for i in range(2):
        finished("completed", 40 * DAY, f"mid-{i}")
    finished("cancelled", 70 * DAY, "c")
    finished("completed", DAY, "new")
    before = snapshot()
    dry = prune(now=T0, dry_run=True, batch_size=2)
    assert snapshot() == before
    assert dry.dry_run
    assert (dry.deleted, dry.compacted) == (
        {"completed": 3},
        {"completed": 2, "cancelled": 1},
    )
    real = prune(now=T0, batch_size=2)
    assert (real.deleted, real.compacted) == (dry.deleted, dry.compacted)
    assert Intent.objects.count() == 4


def test_compaction_does_not_move_updated_at_so_deletion_still_comes(retention):
    id = finished("completed", 31 * DAY, "e")
    updated = row(id).updated_at
    prune(now=T0)
    assert compacted(id)
    assert row(id).updated_at == updated
    report = prune(now=T0 + 60 * DAY)
    assert report.deleted == {"completed": 1}
    assert not Intent.objects.filter(pk=id).exists()


def test_a_second_run_finds_nothing_left_to_do(retention):
    finished("completed", 31 * DAY, "a")
    finished("cancelled", 61 * DAY, "b")
    prune(now=T0)
    before = snapshot()
    report = prune(now=T0)
    assert report.total == 0
    assert report.batches == 0
    assert snapshot() == before


def test_reenqueue_of_a_compacted_intents_event_is_a_no_op(retention):
    id = finished("completed", 31 * DAY, "order-1-paid")
    prune(now=T0)
    before = snapshot()
    again = Intent.objects.enqueue("webhook", "order-1-paid", TARGET, {"body": "new"}, now=T0)
    assert again == id
    assert snapshot() == before
    assert Intent.objects.claim(now=T0 + DAY) is None


def test_reenqueue_after_deletion_runs_the_event_again(retention):
    """The trade-off docs/operations.md warns about: a deleted row forgets its id."""
    id = finished("completed", 91 * DAY, "order-1-paid")
    prune(now=T0)
    again = Intent.objects.enqueue("webhook", "order-1-paid", TARGET, now=T0)
    assert again == id
    assert row(id).state == "pending"


def test_works_in_bounded_batches(retention):
    # An hour past the window, in the day it cuts through: row by row on every
    # database (PostgreSQL drops only days wholly past it, test_storage.py).
    for i in range(5):
        finished("completed", 90 * DAY + timedelta(hours=1), f"e{i}")
    left: list[int] = []
    with CaptureQueriesContext(connection) as queries:
        report = prune(now=T0, batch_size=2, progress=lambda _: left.append(Intent.objects.count()))
    deletes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 3
    assert left == [3, 1, 0]  # each statement deleted its page, and only its page
    assert report.batches == 3
    assert report.deleted == {"completed": 5}
    assert Intent.objects.count() == 0


def test_batches_page_through_equal_timestamps(retention):
    # Ten intents finished at the same instant: pages advance by (updated_at, id).
    at = T0 - 40 * DAY
    for i in range(10):
        Intent.objects.enqueue("webhook", f"e{i}", TARGET, {"i": i}, now=at)
    Intent.objects.update(state="completed", updated_at=at)
    with CaptureQueriesContext(connection) as queries:
        report = prune(now=T0, batch_size=3)
    updates = [q for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 4
    assert report.compacted == {"completed": 10, "cancelled": 0}
    assert Intent.objects.filter(payload__isnull=False).count() == 0


def test_max_batches_stops_and_the_next_call_continues(retention):
    for i in range(5):
        finished("completed", 100 * DAY, f"e{i}")
    first = prune(now=T0, batch_size=2, max_batches=2)
    assert (first.deleted, first.batches, first.finished) == ({"completed": 4}, 2, False)
    assert Intent.objects.count() == 1
    second = prune(now=T0, batch_size=2, max_batches=2)
    assert (second.deleted, second.finished) == ({"completed": 1}, True)
    assert Intent.objects.count() == 0


def test_max_batches_reports_finished_when_the_work_fits(retention):
    finished("completed", 100 * DAY, "e")
    report = prune(now=T0, batch_size=2, max_batches=1)
    assert (report.batches, report.finished) == (1, True)


def test_without_retention_nothing_happens(settings):
    settings.INTENTS = intents()
    finished("completed", 10_000 * DAY, "e")
    before = snapshot()
    report = prune(now=T0)
    assert (report.compacted, report.deleted, report.batches) == ({}, {}, 0)
    assert snapshot() == before


def test_default_now_is_the_current_time(retention):
    retention({"completed": {"delete": DAY}})
    id = finished("completed", 0 * DAY, "e")  # finished at T0, long before today
    prune()
    assert not Intent.objects.filter(pk=id).exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"max_batches": 0}, "max_batches"),
        ({"now": datetime(2026, 1, 1)}, "aware"),  # noqa: DTZ001
    ],
)
def test_bad_arguments_are_refused(retention, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune(**kwargs)


# -- the command ------------------------------------------------------------------


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("prune_intents", *args, stdout=out)
    return out.getvalue()


def aged_for_today() -> dict[str, str]:
    """Intents aged against the real clock, since the command prunes as of now."""
    from django.utils import timezone

    ids = {}
    now = timezone.now()
    for name, state, days in (
        ("deleted", "completed", 100),
        ("compacted", "completed", 40),
        ("young", "completed", 1),
        ("cancelled", "cancelled", 70),
    ):
        at = now - days * DAY
        id = Intent.objects.enqueue("webhook", name, TARGET, {"n": 1}, now=at)
        Intent.objects.filter(pk=id).update(state=state, updated_at=at, last_error="e")
        ids[name] = id
    ids["pending"] = Intent.objects.enqueue("webhook", "p", TARGET, now=now - 1000 * DAY)
    return ids


def test_command_reports_per_state(retention):
    ids = aged_for_today()
    output = run()
    assert output.splitlines() == [
        "completed: 1 compacted, 1 deleted",
        "cancelled: 1 compacted",
    ]
    assert not Intent.objects.filter(pk=ids["deleted"]).exists()
    assert compacted(ids["compacted"]) and compacted(ids["cancelled"])
    assert not compacted(ids["young"])
    assert row(ids["pending"]).state == "pending"


def test_command_dry_run_changes_nothing(retention):
    aged_for_today()
    before = snapshot()
    output = run("--dry-run")
    assert output.splitlines() == [
        "completed: 1 would be compacted, 1 would be deleted",
        "cancelled: 1 would be compacted",
        "Dry run: nothing was changed.",
    ]
    assert snapshot() == before


def test_command_says_when_max_batches_stopped_it(retention):
    aged_for_today()
    output = run("--batch-size", "1", "--max-batches", "1")
    assert output.splitlines() == [
        "completed: 0 compacted, 1 deleted",
        "cancelled: 0 compacted",
        "Stopped after 1 batch (--max-batches); run again to continue.",
    ]
    assert Intent.objects.count() == 4
    assert run().splitlines() == ["completed: 1 compacted, 0 deleted", "cancelled: 1 compacted"]


def test_command_without_retention(settings):
    settings.INTENTS = intents()
    assert run() == "INTENTS['RETENTION'] is not set: every intent is kept.\n"


@pytest.mark.parametrize("args", [("--batch-size", "0"), ("--max-batches", "x")])
def test_command_refuses_bad_numbers(retention, args):
    with pytest.raises(CommandError):
        run(*args)
