"""Fenced, inline and administrative transitions, and every state guard."""

import pytest
from django.db import transaction

from django_intents import backoff
from django_intents.models import Intent

from .conftest import T0, at, enqueue, intents, row, snapshot

pytestmark = pytest.mark.django_db


def claimed(lease: float = 30, now=T0):
    [id] = enqueue()
    intent = Intent.objects.claim(now=now, lease=lease)
    return id, intent.claim_token


def test_renew_extends_the_lease():
    id, token = claimed()
    assert Intent.objects.renew(id, token, now=at(20), lease=30) is True
    assert row(id).claim_until == at(50)
    assert Intent.objects.claim(now=at(40)) is None


def test_complete_finishes_and_clears_the_claim():
    id, token = claimed()
    assert Intent.objects.complete(id, token, now=at(5)) is True
    intent = row(id)
    assert intent.state == "completed"
    assert (intent.claim_token, intent.claim_until, intent.updated_at) == ("", None, at(5))
    assert intent.attempts == 1


def test_retry_schedules_with_backoff_and_keeps_the_error():
    id, token = claimed()
    assert Intent.objects.retry(id, token, ValueError("boom"), now=at(5)) is True
    intent = row(id)
    assert intent.state == "pending"
    assert intent.next_at == at(5) + backoff(id, 1)
    assert intent.last_error == "boom"
    assert (intent.claim_token, intent.claim_until) == ("", None)


def test_retry_without_cause_clears_last_error():
    id, token = claimed()
    Intent.objects.retry(id, token, "first", now=at(1))
    token = Intent.objects.claim(now=at(10_000)).claim_token
    assert Intent.objects.retry(id, token, now=at(10_001)) is True
    assert row(id).last_error == ""
    assert row(id).next_at == at(10_001) + backoff(id, 2)


def test_retry_stores_unstorable_error_text_safely():
    id, token = claimed()
    assert Intent.objects.retry(id, token, "nul\x00 surrogate \ud800 " + "x" * 20_000, now=at(1))
    error = row(id).last_error
    assert "\x00" not in error
    assert error.startswith("nul\\x00 surrogate \\ud800")
    assert len(error) == 10_000


def test_retry_at_max_attempts_cancels_and_keeps_the_error(settings):
    settings.INTENTS = intents(MAX_ATTEMPTS=2)
    id, token = claimed()
    assert Intent.objects.retry(id, token, "one", now=at(1)) is True
    assert row(id).state == "pending"
    token = Intent.objects.claim(now=at(10_000)).claim_token
    assert Intent.objects.retry(id, token, "two", now=at(10_001)) is True
    intent = row(id)
    assert (intent.state, intent.last_error, intent.attempts) == ("cancelled", "two", 2)
    assert Intent.objects.claim(now=at(99_999)) is None


def test_cancel_claim_is_terminal_with_the_cause():
    id, token = claimed()
    assert Intent.objects.cancel_claim(id, token, "gone", now=at(2)) is True
    intent = row(id)
    assert (intent.state, intent.last_error, intent.claim_token) == ("cancelled", "gone", "")
    assert Intent.objects.claim(now=at(99_999)) is None


def test_cancel_claim_without_cause_has_empty_error():
    id, token = claimed()
    Intent.objects.cancel_claim(id, token, now=at(2))
    assert row(id).last_error == ""


FENCED = {
    "renew": lambda id, token, now: Intent.objects.renew(id, token, now=now),
    "complete": lambda id, token, now: Intent.objects.complete(id, token, now=now),
    "retry": lambda id, token, now: Intent.objects.retry(id, token, "late", now=now),
    "cancel_claim": lambda id, token, now: Intent.objects.cancel_claim(id, token, "x", now=now),
}


@pytest.mark.parametrize("method", FENCED)
def test_stale_token_after_takeover_changes_nothing(method):
    id, stale = claimed(lease=10)
    Intent.objects.claim(now=at(10), lease=10)
    before = snapshot()
    assert FENCED[method](id, stale, at(11)) is False
    assert snapshot() == before
    assert row(id).state == "running"


@pytest.mark.parametrize("method", FENCED)
def test_fenced_call_with_a_wrong_token_changes_nothing(method):
    id, _ = claimed()
    before = snapshot()
    assert FENCED[method](id, "0" * 32, at(1)) is False
    assert FENCED[method](id, "", at(1)) is False
    assert snapshot() == before


@pytest.mark.parametrize("method", FENCED)
@pytest.mark.parametrize("finish", ["complete", "cancel", "retry"])
def test_fenced_call_after_the_claim_ended_changes_nothing(method, finish):
    id, token = claimed()
    {
        "complete": lambda: Intent.objects.complete(id, token, now=at(1)),
        "cancel": lambda: Intent.objects.cancel(id, now=at(1)),
        "retry": lambda: Intent.objects.retry(id, token, "x", now=at(1)),
    }[finish]()
    before = snapshot()
    assert FENCED[method](id, token, at(2)) is False
    assert snapshot() == before


@pytest.mark.parametrize("method", FENCED)
def test_fenced_call_on_an_unknown_id_returns_false(method):
    assert FENCED[method]("f" * 64, "0" * 32, at(1)) is False
    assert snapshot() == []


@pytest.mark.parametrize("method", FENCED)
def test_expired_but_not_taken_over_claim_still_holds(method):
    id, token = claimed(lease=10)
    assert FENCED[method](id, token, at(15)) is True


def test_complete_pending_inside_the_callers_transaction():
    [id] = enqueue()
    with transaction.atomic():
        assert Intent.objects.complete_pending(id, now=at(1)) is True
    intent = row(id)
    assert (intent.state, intent.attempts, intent.updated_at) == ("completed", 0, at(1))


def test_complete_pending_rolls_back_with_the_callers_transaction():
    [id] = enqueue()
    before = snapshot()
    with pytest.raises(RuntimeError), transaction.atomic():
        Intent.objects.complete_pending(id, now=at(1))
        raise RuntimeError("inline work failed")
    assert snapshot() == before


def test_enqueue_and_complete_pending_in_one_rolled_back_transaction_leave_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        id = Intent.objects.enqueue("webhook", "e", "t", now=T0)
        Intent.objects.complete_pending(id, now=T0)
        raise RuntimeError("rolled back")
    assert snapshot() == []


def test_complete_pending_leaves_a_running_intent_to_its_worker():
    id, token = claimed()
    before = snapshot()
    assert Intent.objects.complete_pending(id, now=at(1)) is False
    assert snapshot() == before
    assert Intent.objects.complete(id, token, now=at(2)) is True


@pytest.mark.parametrize("finish", ["complete", "cancel"])
def test_complete_pending_leaves_terminal_intents(finish):
    id, token = claimed()
    if finish == "complete":
        Intent.objects.complete(id, token, now=at(1))
    else:
        Intent.objects.cancel(id, now=at(1))
    before = snapshot()
    assert Intent.objects.complete_pending(id, now=at(2)) is False
    assert snapshot() == before


def test_retry_now_makes_a_future_pending_intent_due():
    [id] = enqueue(next_at=at(3600))
    assert Intent.objects.retry_now(id, now=at(1)) is True
    assert row(id).next_at == at(1)
    assert Intent.objects.claim(now=at(1)).id == id


def test_retry_now_fences_the_running_claimant():
    id, token = claimed()
    assert Intent.objects.retry_now(id, now=at(1)) is True
    intent = row(id)
    assert (intent.state, intent.next_at, intent.claim_token) == ("pending", at(1), "")
    assert intent.attempts == 1
    for method in FENCED.values():
        assert method(id, token, at(2)) is False
    assert row(id).state == "pending"


def test_cancel_fences_the_running_claimant():
    id, token = claimed()
    assert Intent.objects.cancel(id, now=at(1)) is True
    assert row(id).state == "cancelled"
    for method in FENCED.values():
        assert method(id, token, at(2)) is False
    assert row(id).state == "cancelled"


def test_cancel_a_pending_intent():
    [id] = enqueue()
    assert Intent.objects.cancel(id, now=at(1)) is True
    assert row(id).state == "cancelled"
    assert Intent.objects.claim(now=at(99)) is None


@pytest.mark.parametrize("admin", ["retry_now", "cancel"])
@pytest.mark.parametrize("finish", ["complete", "cancel_claim"])
def test_administrative_actions_never_touch_terminal_intents(admin, finish):
    id, token = claimed()
    getattr(Intent.objects, finish)(id, token, now=at(1))
    before = snapshot()
    assert getattr(Intent.objects, admin)(id, now=at(2)) is False
    assert snapshot() == before


@pytest.mark.parametrize(
    "call",
    [
        lambda: Intent.objects.complete("", "t"),
        lambda: Intent.objects.complete("x" * 65, "t"),
        lambda: Intent.objects.renew("id", None),
        lambda: Intent.objects.renew("id", "t", lease=-1),
        lambda: Intent.objects.retry(None, "t"),
        lambda: Intent.objects.retry_now(""),
        lambda: Intent.objects.cancel(5),
        lambda: Intent.objects.complete_pending("id\x00"),
    ],
)
def test_bad_arguments_raise_and_change_nothing(call):
    enqueue()
    before = snapshot()
    with pytest.raises((TypeError, ValueError)):
        call()
    assert snapshot() == before


def test_pending_lists_unfinished_intents_in_claim_order():
    a = Intent.objects.enqueue("push", "a", "t", next_at=at(5), now=T0)
    b = Intent.objects.enqueue("webhook", "b", "t", next_at=at(1), now=T0)
    c = Intent.objects.enqueue("push", "c", "t", next_at=at(3), now=T0)
    done = Intent.objects.enqueue("push", "d", "t", next_at=T0, now=T0)
    Intent.objects.complete_pending(done, now=T0)
    Intent.objects.claim(now=at(3), kinds=["push"])
    assert list(Intent.objects.pending().values_list("id", flat=True)) == [b, c, a]
    assert list(Intent.objects.pending("push").values_list("id", flat=True)) == [c, a]


def test_in_state_filters_and_orders():
    a = Intent.objects.enqueue("job", "a", "t", next_at=at(2), now=T0)
    b = Intent.objects.enqueue("job", "b", "t", next_at=at(1), now=T0)
    Intent.objects.cancel(a, now=T0)
    assert list(Intent.objects.in_state("cancelled").values_list("id", flat=True)) == [a]
    assert list(Intent.objects.in_state(Intent.State.PENDING).values_list("id", flat=True)) == [b]
    assert list(Intent.objects.in_state().values_list("id", flat=True)) == [b, a]


def test_in_state_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="'done'"):
        Intent.objects.in_state("done")


def test_queryset_vocabulary():
    due = Intent.objects.enqueue("job", "due", "t", now=T0)
    later = Intent.objects.enqueue("job", "later", "t", next_at=at(100), now=T0)
    Intent.objects.claim(now=T0, lease=10)
    assert list(Intent.objects.due(at(5)).values_list("id", flat=True)) == []
    assert list(Intent.objects.expired(at(10)).values_list("id", flat=True)) == [due]
    assert list(Intent.objects.due(at(100)).values_list("id", flat=True)) == [due, later]
    Intent.objects.cancel(later, now=T0)
    assert list(Intent.objects.terminal().values_list("id", flat=True)) == [later]
