"""``Intent.objects.redrive`` and ``redrive_many``: cancelled intents run again (SPEC §14).

A redriven intent is ``pending`` and due now, keeps its id, payload,
``attempts`` and ``last_error``, and has a fresh ``MAX_ATTEMPTS``: the
attempts that counted before are written off, which the claim/fail cycles
below prove through the manager, the claim's SQL and the lease's expiry.
Batches commit one at a time, each fenced on ``cancelled``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_intents import managers
from django_intents.models import Intent
from django_intents.rules.retries import backoff, counted

from .conftest import T0, at, intents, row, snapshot

pytestmark = pytest.mark.django_db


def cancelled(
    kind: str = "webhook",
    target: str = "https://a.example/hook",
    *,
    when: datetime = T0,
    event: str = "e",
    failures: int = 0,
    error: str = "boom",
) -> str:
    """A cancelled intent: after ``failures`` real claim/fail cycles ending at the last
    allowed attempt (``MAX_ATTEMPTS=failures``), or cancelled by hand; at ``when``."""
    id = Intent.objects.enqueue(kind, event, target, {"event": event}, now=T0)  # noqa: A001
    if not failures:
        assert Intent.objects.cancel(id, now=when)
        return id
    with override_settings(INTENTS=intents(MAX_ATTEMPTS=failures)):
        for n in range(failures):
            due = when if n == failures - 1 else T0
            [claim] = Intent.objects.claim_many(1, now=due, kinds=[kind])
            assert Intent.objects.retry(id, claim.claim_token, f"{error} {n + 1}", now=due)
            Intent.objects.filter(pk=id, state="pending").update(next_at=T0)  # backoff skipped
    assert row(id).state == "cancelled"
    return id


def others(*ids: str) -> list[tuple[Any, ...]]:
    """Every row but ``ids``: what a redrive must leave as it was."""
    return [r for r in snapshot() if r[0] not in ids]


# -- what matches ------------------------------------------------------------------


def test_every_cancelled_intent_becomes_pending_and_due_now():
    ids = [cancelled(event=str(n), when=at(n)) for n in range(3)]
    assert Intent.objects.redrive(now=at(100)) == 3
    for id in ids:  # noqa: A001
        intent = row(id)
        assert (intent.state, intent.next_at, intent.updated_at) == ("pending", at(100), at(100))
        assert (intent.claim_token, intent.claim_until) == ("", None)


def test_only_cancelled_intents_are_touched():
    redriven = cancelled(event="c")
    pending = Intent.objects.enqueue("webhook", "p", "t", now=T0)
    running = Intent.objects.enqueue("webhook", "r", "t", now=T0, next_at=at(-1))
    [claim] = Intent.objects.claim_many(1, now=at(1), kinds=["webhook"])
    assert claim.id == running
    done = Intent.objects.enqueue("webhook", "d", "t", now=T0, next_at=at(-2))
    [claim] = Intent.objects.claim_many(1, now=at(1), kinds=["webhook"])
    assert Intent.objects.complete(done, claim.claim_token, now=at(2))
    untouched = others(redriven)
    assert Intent.objects.redrive(now=at(100)) == 1
    assert others(redriven) == untouched
    assert {row(pending).state, row(running).state, row(done).state} == {
        "pending",
        "running",
        "completed",
    }


def test_kind_and_target_narrow_the_match():
    a_x = cancelled("webhook", "x", event="1")
    a_y = cancelled("webhook", "y", event="2")
    b_x = cancelled("push", "x", event="3")
    assert Intent.objects.redrive(kind="webhook", target="x", now=at(100)) == 1
    assert [row(i).state for i in (a_x, a_y, b_x)] == ["pending", "cancelled", "cancelled"]
    assert Intent.objects.redrive(kind="push", now=at(100)) == 1
    assert [row(i).state for i in (a_y, b_x)] == ["cancelled", "pending"]
    assert Intent.objects.redrive(target="y", now=at(100)) == 1
    assert row(a_y).state == "pending"


def test_the_window_counts_from_updated_at_after_inclusive_before_exclusive():
    ids = {n: cancelled(event=str(n), when=at(n)) for n in (10, 20, 30, 40)}
    assert Intent.objects.redrive(finished_after=at(20), finished_before=at(40), now=at(99)) == 2
    assert {n: row(id).state for n, id in ids.items()} == {
        10: "cancelled",
        20: "pending",
        30: "pending",
        40: "cancelled",
    }
    assert Intent.objects.redrive(finished_before=at(11), now=at(99)) == 1
    assert Intent.objects.redrive(finished_after=at(40), now=at(99)) == 1
    assert not Intent.objects.filter(state="cancelled").exists()


def test_an_intent_cancelled_after_now_is_left_for_the_next_redrive():
    early, late = cancelled(event="1", when=at(10)), cancelled(event="2", when=at(60))
    assert Intent.objects.redrive(now=at(30)) == 1
    assert (row(early).state, row(late).state) == ("pending", "cancelled")


def test_no_match_writes_nothing_and_returns_zero():
    cancelled(kind="webhook")
    before = snapshot()
    assert Intent.objects.redrive(kind="push", now=at(100)) == 0
    assert snapshot() == before


def test_dry_run_counts_and_writes_nothing(announced):
    for n in range(5):
        cancelled(event=str(n), target="x" if n < 3 else "y")
    before = snapshot()
    assert Intent.objects.redrive(target="x", dry_run=True, now=at(100)) == 3
    assert Intent.objects.redrive(dry_run=True, now=at(100), batch_size=2) == 5
    assert snapshot() == before
    assert announced == []


# -- what is kept, and the fresh budget ---------------------------------------------


def test_id_payload_attempts_and_last_error_are_kept():
    id = cancelled(failures=3, error="partner said no")  # noqa: A001
    before = row(id)
    assert (before.attempts, before.last_error) == (3, "partner said no 3")
    Intent.objects.redrive(now=at(100))
    after = row(id)
    assert (after.id, after.payload, after.attempts, after.last_error) == (
        before.id,
        before.payload,
        3,
        "partner said no 3",
    )
    assert (after.kind, after.event_id, after.target, after.created_at) == (
        before.kind,
        before.event_id,
        before.target,
        before.created_at,
    )
    assert (after.written_off, counted(after)) == (3, 0)


def test_a_redriven_intent_gets_max_attempts_more_attempts():
    """Cancelled on its 2nd of 2 attempts, redriven: two more real claim/fail cycles,
    the first retried (not cancelled), the second cancelled again."""
    id = cancelled(failures=2)  # noqa: A001
    assert (row(id).attempts, row(id).state) == (2, "cancelled")
    assert Intent.objects.redrive(now=at(100)) == 1
    with override_settings(INTENTS=intents(MAX_ATTEMPTS=2)):
        [claim] = Intent.objects.claim_many(1, now=at(101), kinds=["webhook"])
        assert Intent.objects.retry(id, claim.claim_token, "again 1", now=at(101))
        intent = row(id)
        assert (intent.state, intent.attempts, intent.last_error) == ("pending", 3, "again 1")
        # The backoff starts over too: that of a first failure, not of a third.
        assert intent.next_at == at(101) + backoff(id, 1)
        [claim] = Intent.objects.claim_many(1, now=intent.next_at, kinds=["webhook"])
        assert Intent.objects.retry(id, claim.claim_token, "again 2", now=intent.next_at)
    intent = row(id)
    assert (intent.state, intent.attempts, intent.written_off) == ("cancelled", 4, 2)


def test_snoozes_are_not_written_off_twice():
    """``written_off`` is what counted: ``attempts - snoozes``, so a snoozed intent's
    budget is fresh too, and a second redrive writes off only what counted since."""
    id = Intent.objects.enqueue("webhook", "s", "t", now=T0)  # noqa: A001
    Intent.objects.filter(pk=id).update(state="cancelled", attempts=5, snoozes=2)
    Intent.objects.redrive(now=at(100))
    assert (row(id).written_off, counted(row(id))) == (3, 0)
    with override_settings(INTENTS=intents(MAX_ATTEMPTS=1)):
        [claim] = Intent.objects.claim_many(1, now=at(101), kinds=["webhook"])
        assert Intent.objects.retry(id, claim.claim_token, "no", now=at(101))
    assert (row(id).state, row(id).attempts) == ("cancelled", 6)
    Intent.objects.redrive(now=at(200))
    assert (row(id).written_off, counted(row(id))) == (4, 0)


@override_settings(INTENTS=intents(MAX_ATTEMPTS=2))
def test_an_expired_lease_of_a_redriven_intent_is_claimed_again_not_cancelled():
    """The claim's SQL counts as ``counted`` does: after a redrive of an intent at its
    last attempt, one lost lease leaves a second attempt in its budget."""
    id = cancelled(failures=2)  # noqa: A001
    Intent.objects.redrive(now=at(100))
    [first] = Intent.objects.claim_many(1, now=at(101), lease=10, kinds=["webhook"])
    [again] = Intent.objects.claim_many(1, now=at(120), lease=10, kinds=["webhook"])
    assert (again.id, again.attempts, again.state) == (id, 4, "running")
    assert again.claim_token != first.claim_token
    # Its lease lost too, the budget is spent: the next claim cancels it.
    assert Intent.objects.claim_many(1, now=at(140), kinds=["webhook"]) == []
    intent = row(id)
    assert (intent.state, intent.attempts) == ("cancelled", 4)
    assert "last allowed attempt" in intent.last_error


# -- batches, the fence and the signal ------------------------------------------------


def test_batches_commit_one_at_a_time_and_report_progress():
    ids = [cancelled(event=str(n), when=at(n)) for n in range(7)]
    seen: list[int] = []
    with CaptureQueriesContext(connection) as queries:
        assert Intent.objects.redrive(now=at(100), batch_size=3, progress=seen.append) == 7
    assert seen == [3, 3, 1]
    updates = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 3
    assert all(row(id).state == "pending" for id in ids)


def test_more_than_one_default_batch():
    Intent.objects.enqueue_many(
        [{"kind": "job", "event_id": str(n), "target": "t"} for n in range(1201)], now=T0
    )
    Intent.objects.filter(kind="job").update(state="cancelled", updated_at=at(1))
    seen: list[int] = []
    assert Intent.objects.redrive(now=at(100), progress=seen.append) == 1201
    assert seen == [500, 500, 201]
    assert Intent.objects.filter(kind="job", state="pending", next_at=at(100)).count() == 1201


def test_an_intent_that_moved_between_the_read_and_the_write_is_left_alone(monkeypatch):
    """Another operator redrives one intent of the batch and a worker claims it after
    the batch was read: the batch's write, fenced on ``cancelled``, leaves its claim."""
    ids = [cancelled(event=str(n), when=at(n)) for n in range(3)]
    real = managers.redrive_batch
    taken: list[Intent] = []

    def meanwhile(backend: Any, batch: list[str], *, now: datetime) -> Any:
        if not taken:
            assert real(backend, [batch[1]], now=at(50)) == [(batch[1], "webhook")]
            taken.extend(Intent.objects.claim_many(1, now=at(51), kinds=["webhook"]))
        return real(backend, batch, now=now)

    monkeypatch.setattr(managers, "redrive_batch", meanwhile)
    assert Intent.objects.redrive(now=at(100)) == 2
    [claim] = taken
    held = row(ids[1])
    assert (held.state, held.claim_token, held.updated_at) == ("running", claim.claim_token, at(51))
    assert [row(ids[0]).state, row(ids[2]).state] == ["pending", "pending"]
    assert [row(ids[0]).next_at, row(ids[2]).next_at] == [at(100), at(100)]


def test_each_batch_announces_its_transition(django_capture_on_commit_callbacks, announced):
    cancelled("webhook", event="1", when=at(1))
    cancelled("push", event="2", when=at(2))
    cancelled("webhook", event="3", when=at(3))
    announced.clear()
    with django_capture_on_commit_callbacks(execute=True):
        Intent.objects.redrive(now=at(100), batch_size=2)
    assert announced == [("pending", ["push", "webhook"]), ("pending", ["webhook"])]


# -- redrive_many: the admin's selection -------------------------------------------------


def test_redrive_many_moves_the_cancelled_ids_and_leaves_the_rest(
    django_capture_on_commit_callbacks, announced
):
    first, second = cancelled(event="1"), cancelled(event="2")
    pending = Intent.objects.enqueue("webhook", "p", "t", now=T0)
    untouched = others(first, second)
    with django_capture_on_commit_callbacks(execute=True):
        moved = Intent.objects.redrive_many([first, pending, second, first, "0" * 64], now=at(9))
    assert sorted(moved) == sorted([first, second])
    assert others(first, second) == untouched
    assert {row(first).state, row(second).state} == {"pending"}
    assert announced[-1] == ("pending", ["webhook", "webhook"])


def test_redrive_many_of_nothing_writes_nothing():
    cancelled()
    before = snapshot()
    assert Intent.objects.redrive_many([]) == []
    assert snapshot() == before


# -- bad input: a clear error, nothing written ---------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"finished_after": datetime(2026, 1, 1)}, ValueError, "finished_after must be an aware"),
        ({"finished_before": "2026-01-01"}, TypeError, "finished_before must be a datetime"),
        ({"finished_after": at(5), "finished_before": at(5)}, ValueError, "must be earlier"),
        ({"kind": ""}, ValueError, "kind must not be empty"),
        ({"kind": 3}, ValueError, "kind must be a string"),
        ({"target": b"x"}, ValueError, "target must be a string"),
        ({"dry_run": "yes"}, TypeError, "dry_run must be True or False"),
        ({"batch_size": 0}, ValueError, "batch_size must be from 1 to 500"),
        ({"batch_size": 501}, ValueError, "batch_size must be from 1 to 500"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
        ({"progress": 3}, TypeError, "progress must be callable"),
        ({"now": datetime(2026, 1, 1)}, ValueError, "now must be an aware"),
    ],
)
def test_bad_arguments_are_refused_and_nothing_is_written(kwargs, error, message):
    cancelled()
    before = snapshot()
    with pytest.raises(error, match=message):
        Intent.objects.redrive(**kwargs)
    assert snapshot() == before


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        ("abc", TypeError, "not a single string"),
        (["known", ""], ValueError, "id must not be empty"),
        (["known", None], ValueError, "id must be a string"),
    ],
)
def test_bad_ids_are_refused_and_nothing_is_written(ids, error, message):
    cancelled()
    before = snapshot()
    with pytest.raises(error, match=message):
        Intent.objects.redrive_many(ids)
    assert snapshot() == before
