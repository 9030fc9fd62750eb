"""``Attempt``: ``check()``, ``atomic()`` and the fenced ``release`` a pool uses at shutdown."""

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_intents import Attempt, ClaimLost
from django_intents.models import Intent
from tests.testapp.models import Effect

from .conftest import T0, at, row, snapshot

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(kind: str = "job") -> Intent:
    Intent.objects.enqueue(kind, "event", "target", {"x": 1})
    intent = Intent.objects.claim(kinds=[kind])
    assert intent is not None
    return intent


def in_other_connection(func: Callable[[], object]) -> object:
    """Run ``func`` in a thread, so on a database connection of its own, and return its result."""
    results: list[object] = []

    def target() -> None:
        try:
            results.append(func())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the other connection did not finish"
    return results[0]


def test_check_passes_until_cancelled_then_raises_claim_lost():
    attempt = Attempt(claimed())
    attempt.check()
    attempt.cancelled.set()
    with pytest.raises(ClaimLost, match="shutting down"):
        attempt.check()


def test_atomic_commits_the_writes_and_the_completion_together():
    intent = claimed()
    attempt = Attempt(intent)

    with attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token, note="sent")

    assert attempt.completed
    assert row(intent.id).state == Intent.State.COMPLETED
    assert row(intent.id).claim_token == ""
    assert list(Effect.objects.values_list("intent_id", "note")) == [(intent.id, "sent")]


def test_atomic_after_an_administrative_retry_now_rolls_back_and_raises_claim_lost():
    intent = claimed()
    attempt = Attempt(intent)
    assert in_other_connection(lambda: Intent.objects.retry_now(intent.id)) is True

    with pytest.raises(ClaimLost, match="rolled back"), attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token, note="sent")

    assert not attempt.completed
    assert attempt.lost
    assert Effect.objects.count() == 0
    fresh = row(intent.id)
    assert (fresh.state, fresh.claim_token, fresh.attempts) == (Intent.State.PENDING, "", 1)


def test_atomic_after_an_administrative_cancel_rolls_back_and_leaves_it_cancelled():
    intent = claimed()
    attempt = Attempt(intent)
    assert in_other_connection(lambda: Intent.objects.cancel(intent.id)) is True

    with pytest.raises(ClaimLost), attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token)

    assert Effect.objects.count() == 0
    assert row(intent.id).state == Intent.State.CANCELLED


def test_atomic_after_another_worker_reclaimed_an_expired_lease_rolls_back():
    intent = claimed()
    attempt = Attempt(intent)
    later = timezone.now() + timedelta(hours=1)
    other = in_other_connection(lambda: Intent.objects.claim(now=later, kinds=["job"]))
    assert isinstance(other, Intent)
    assert other.claim_token != intent.claim_token

    with pytest.raises(ClaimLost), attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token)

    assert Effect.objects.count() == 0
    fresh = row(intent.id)
    assert (fresh.state, fresh.claim_token, fresh.attempts) == ("running", other.claim_token, 2)


def test_an_exception_inside_atomic_rolls_back_and_leaves_the_claim_running():
    intent = claimed()
    attempt = Attempt(intent)

    with pytest.raises(RuntimeError, match="partner down"), attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token)
        raise RuntimeError("partner down")

    assert not attempt.completed
    assert Effect.objects.count() == 0
    fresh = row(intent.id)
    assert (fresh.state, fresh.claim_token) == (Intent.State.RUNNING, intent.claim_token)


def test_atomic_commits_even_when_cancelled_for_shutdown():
    # cancelled alone means "please stop"; the claim is still valid and may complete.
    intent = claimed()
    attempt = Attempt(intent)
    attempt.cancelled.set()

    with attempt.atomic():
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token)

    assert row(intent.id).state == Intent.State.COMPLETED
    assert Effect.objects.count() == 1


def test_atomic_inside_another_transaction_is_refused_and_writes_nothing():
    intent = claimed()
    before = snapshot()
    with (
        transaction.atomic(),
        pytest.raises(RuntimeError, match="nested"),
        Attempt(intent).atomic(),
    ):
        Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token)
    assert snapshot() == before
    assert Effect.objects.count() == 0


def test_atomic_twice_is_refused():
    intent = claimed()
    attempt = Attempt(intent)
    with attempt.atomic():
        pass
    with pytest.raises(RuntimeError, match="already completed"), attempt.atomic():
        pass


def test_release_returns_a_claim_to_pending_due_now_keeping_attempts_and_error():
    Intent.objects.enqueue("job", "e", "t", now=T0)
    first = Intent.objects.claim(now=at(1))
    Intent.objects.retry(first.id, first.claim_token, "ValueError: x", now=at(2))
    second = Intent.objects.claim(now=at(3600))

    assert Intent.objects.release(second.id, second.claim_token, now=at(3601)) is True

    fresh = row(second.id)
    assert fresh.state == Intent.State.PENDING
    assert fresh.next_at == fresh.updated_at == at(3601)
    assert (fresh.claim_token, fresh.claim_until) == ("", None)
    assert (fresh.attempts, fresh.last_error) == (2, "ValueError: x")


def test_release_with_a_stale_token_changes_nothing():
    intent = claimed()
    Intent.objects.retry_now(intent.id)
    again = Intent.objects.claim(kinds=["job"])
    before = snapshot()

    assert Intent.objects.release(intent.id, intent.claim_token) is False

    assert snapshot() == before
    assert row(again.id).claim_token == again.claim_token


@pytest.mark.parametrize("admin", ["complete", "cancel"])
def test_release_of_a_finished_intent_changes_nothing(admin):
    intent = claimed()
    if admin == "complete":
        Intent.objects.complete(intent.id, intent.claim_token)
    else:
        Intent.objects.cancel(intent.id)
    before = snapshot()
    assert Intent.objects.release(intent.id, intent.claim_token) is False
    assert snapshot() == before
