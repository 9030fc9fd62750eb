"""Snoozes (SPEC §10): ``raise Retry(after=..., reason=...)`` runs the intent again later.

A snooze goes back to ``pending``, due ``after`` from the handler's raise,
with the reason as ``last_error``; ``attempts`` counts the claim and
``snoozes`` the snooze, and ``MAX_ATTEMPTS`` and the backoff count
``attempts - snoozes`` wherever they apply: the pool's recorder,
``manager.retry``, the claim's cancellation of exhausted leases and the
django.tasks runner. Every failure path checks the rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_intents import Retry
from django_intents.models import Intent
from django_intents.rules.retries import backoff
from django_intents.signals import Outcome
from django_intents.store.base import Ending
from django_intents.store.clock import server_now
from django_intents.tasks.compat import TaskResultStatus
from tests.testapp import tasks

from .conftest import at, external_kinds, intents, row
from .conftest import enqueue as enqueue_at_t0
from .test_tasks_runner import drain as drain_tasks
from .test_tasks_runner import retrying
from .test_worker_pool import background, enqueue, finished, pool  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("s.snooze", "s.async")


@pytest.fixture(autouse=True)
def snooze_kinds() -> Iterator[None]:
    with external_kinds(*KINDS):
        yield


def max_attempts(n: int) -> dict[str, Any]:
    """``INTENTS`` with ``MAX_ATTEMPTS`` set, still declaring this module's kinds."""
    return intents(MAX_ATTEMPTS=n, EXTERNAL_KINDS=[*intents().get("EXTERNAL_KINDS", ()), *KINDS])


def drain(handler: Any, background: Any, kind: str = "s.snooze") -> None:  # noqa: F811
    assert background(pool({kind: handler}, drain=True)).join() == 0


# -- Retry itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "after",
    [datetime(2026, 1, 1, 12, 0), -1, -0.5, timedelta(seconds=-1), "30", True, [30]],
    ids=[
        "naive-datetime",
        "negative",
        "negative-float",
        "negative-timedelta",
        "str",
        "bool",
        "list",
    ],
)
def test_retry_refuses_an_after_that_is_not_a_delay_or_an_aware_time(after):
    with pytest.raises(ValueError, match=r"Retry\(after="):
        Retry(after=after, reason="429")


def test_retry_due_is_never_before_now_and_none_without_after():
    now = timezone.now()
    assert Retry(after=0).due(now) == now
    assert Retry(after=now - timedelta(hours=1)).due(now) == now
    assert Retry(after=now + timedelta(seconds=5)).due(now) == now + timedelta(seconds=5)
    assert Retry(after=timedelta(seconds=2)).due(now) == now + timedelta(seconds=2)
    assert Retry(after=1.5).due(now) == now + timedelta(seconds=1.5)
    assert Retry(reason="later").due(now) is None


# -- in the pool -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "after",
    [60, 60.5, timedelta(seconds=60), "aware-datetime"],
    ids=["int", "float", "timedelta", "aware-datetime"],
)
def test_retry_after_snoozes_the_intent_without_exhausting_it(background, finished, after):  # noqa: F811
    raised: list[datetime] = []

    def handler(intent: Intent, attempt: Any) -> None:
        raised.append(server_now())  # the clock that writes next_at
        delay = raised[0] + timedelta(seconds=60) if after == "aware-datetime" else after
        raise Retry(after=delay, reason="429 Too Many Requests")

    (id,) = enqueue("s.snooze")
    with override_settings(INTENTS=max_attempts(1)):
        drain(handler, background)

    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 1, 1)
    assert intent.last_error == "429 Too Many Requests"
    assert (intent.claim_token, intent.claim_until) == ("", None)
    assert raised[0] + timedelta(seconds=60) <= intent.next_at
    assert intent.next_at <= timezone.now() + timedelta(seconds=61)
    assert [signal["outcome"] for signal in finished] == [Outcome.SNOOZED]


@pytest.mark.parametrize("after", [0, "past"], ids=["zero", "past-datetime"])
def test_retry_after_zero_or_a_past_time_is_due_at_once(background, after):  # noqa: F811
    calls: list[int] = []

    def handler(intent: Intent, attempt: Any) -> None:
        calls.append(intent.attempts)
        if len(calls) == 1:
            when = timezone.now() - timedelta(hours=1) if after == "past" else after
            raise Retry(after=when, reason="not yet")

    (id,) = enqueue("s.snooze")
    drain(handler, background)

    intent = row(id)
    assert calls == [1, 2]  # the drain ran it again: it was due at once
    assert (intent.state, intent.attempts, intent.snoozes) == ("completed", 2, 1)
    assert intent.last_error == "not yet"


@override_settings(INTENTS=max_attempts(2))
def test_three_snoozes_leave_max_attempts_2_untouched_and_the_next_failures_count(background):  # noqa: F811
    calls: list[int] = []

    def handler(intent: Intent, attempt: Any) -> None:
        calls.append(intent.attempts)
        if len(calls) <= 3:
            raise Retry(after=0, reason=f"busy {len(calls)}")
        raise KeyError("partner down")

    (id,) = enqueue("s.snooze")
    drain(handler, background)

    intent = row(id)
    assert calls == [1, 2, 3, 4]
    # Attempt 4 is the first that counts: retried, with the backoff of a first failure.
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 4, 3)
    assert intent.last_error == "KeyError: 'partner down'"
    assert intent.next_at <= timezone.now() + backoff(id, 1)

    assert Intent.objects.retry_now(id)
    drain(handler, background)

    intent = row(id)
    assert calls == [1, 2, 3, 4, 5]
    assert (intent.state, intent.attempts, intent.snoozes) == ("cancelled", 5, 3)
    assert intent.last_error == "KeyError: 'partner down'"


def test_retry_without_after_is_an_ordinary_failure_with_backoff(background, finished):  # noqa: F811
    def handler(intent: Intent, attempt: Any) -> None:
        raise Retry(reason="try again later")

    (id,) = enqueue("s.snooze")
    before = timezone.now()
    drain(handler, background)

    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 1, 0)
    assert intent.last_error == "try again later"
    assert intent.next_at >= before + backoff(id, 1) - timedelta(seconds=1)
    assert [signal["outcome"] for signal in finished] == [Outcome.ERROR]


@override_settings(INTENTS=max_attempts(1))
def test_retry_without_after_counts_toward_max_attempts(background):  # noqa: F811
    def handler(intent: Intent, attempt: Any) -> None:
        raise Retry(reason="try again later")

    (id,) = enqueue("s.snooze")
    drain(handler, background)

    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("cancelled", 1, 0)
    assert intent.last_error == "try again later"


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        (datetime(2030, 1, 1, 12, 0), "naive datetime"),
        (-5, "negative delay"),
        ("30", "not str"),
    ],
    ids=["naive-datetime", "negative", "str"],
)
def test_a_bad_after_is_recorded_as_the_handlers_value_error(background, finished, after, problem):  # noqa: F811
    def handler(intent: Intent, attempt: Any) -> None:
        raise Retry(after=after, reason="429")

    (id,) = enqueue("s.snooze")
    before = timezone.now()
    drain(handler, background)

    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 1, 0)
    assert intent.last_error.startswith("ValueError: Retry(after=")
    assert problem in intent.last_error
    assert intent.next_at >= before + backoff(id, 1) - timedelta(seconds=1)
    assert [signal["outcome"] for signal in finished] == [Outcome.ERROR]


def test_an_async_handler_raising_retry_after_snoozes_too(background, finished):  # noqa: F811
    raised: list[datetime] = []

    async def handler(intent: Intent, attempt: Any) -> None:
        await asyncio.sleep(0.01)
        raised.append(server_now())
        raise Retry(after=timedelta(seconds=30), reason="Retry-After: 30")

    (id,) = enqueue("s.async")
    drain(handler, background, kind="s.async")

    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 1, 1)
    assert intent.last_error == "Retry-After: 30"
    assert raised[0] + timedelta(seconds=30) <= intent.next_at
    assert intent.next_at <= timezone.now() + timedelta(seconds=31)
    assert [signal["outcome"] for signal in finished] == [Outcome.SNOOZED]


# -- the other places MAX_ATTEMPTS applies --------------------------------------------


def snoozed(id: str, times: int, start: float = 0) -> None:  # noqa: A002
    """Claim and snooze ``id`` ``times`` times through the pool's own batch write."""
    for n in range(times):
        intent = Intent.objects.claim(now=at(start + n))
        assert intent is not None and intent.id == id
        ending = Ending(id, intent.claim_token, "pending", next_at=at(start + n), snooze=True)
        assert Intent.objects.finish_many([ending], now=at(start + n)) == [id]


@override_settings(INTENTS=max_attempts(2))
def test_manager_retry_counts_attempts_minus_snoozes():
    (id,) = enqueue_at_t0(kind="s.snooze")
    snoozed(id, 2)
    token = Intent.objects.claim(now=at(10)).claim_token
    assert Intent.objects.retry(id, token, "first that counts", now=at(10))
    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 3, 2)
    assert intent.next_at == at(10) + backoff(id, 1)  # the backoff of a first failure

    token = Intent.objects.claim(now=at(10_000)).claim_token
    assert Intent.objects.retry(id, token, "second that counts", now=at(10_000))
    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("cancelled", 4, 2)
    assert intent.last_error == "second that counts"


@override_settings(INTENTS=max_attempts(2))
def test_an_expired_lease_after_snoozes_is_claimed_again_not_cancelled():
    (id,) = enqueue_at_t0(kind="s.snooze")
    snoozed(id, 2)
    assert Intent.objects.claim(now=at(10), lease=10).attempts == 3  # counts 1, then expires

    again = Intent.objects.claim(now=at(21), lease=10)  # counts 2, then expires
    assert again is not None and again.id == id
    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("running", 4, 2)

    assert Intent.objects.claim(now=at(32), lease=10) is None
    intent = row(id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("cancelled", 4, 2)
    assert "MAX_ATTEMPTS=2" in intent.last_error


@retrying(2)
def test_the_task_runner_does_not_fail_a_task_whose_earlier_claims_were_snoozes():
    enqueued = tasks.fail.enqueue("boom")
    # One claim of it ended in a snooze: the next is the first that counts.
    Intent.objects.filter(pk=enqueued.id).update(attempts=1, snoozes=1)

    drain_tasks()

    assert tasks.fail.get_result(enqueued.id).status == TaskResultStatus.READY
    intent = row(enqueued.id)
    assert (intent.state, intent.attempts, intent.snoozes) == ("pending", 2, 1)
    assert intent.last_error == "ValueError: boom"
