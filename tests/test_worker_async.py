"""Async handlers in the pool: awaited on its event loop, bounded by ``concurrency``.

The pool runs in a thread of this process (``test_worker_pool.Background``);
every test checks the rows the pool left behind, since a coroutine's result
reaches the database only through the pool's loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from django_intents import ClaimLost, Stop
from django_intents.models import Intent
from django_intents.rules.retries import backoff
from django_intents.signals import Outcome

from .conftest import external_kinds, row
from .test_worker_pool import background, enqueue, finished, pool  # noqa: F401 - fixtures
from .workerutil import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def async_kinds() -> Iterator[None]:
    with external_kinds("a.ok", "a.fail", "a.stop", "a.lost", "a.sync", "a.slow", "a.wrapped"):
        yield


def outcomes(sent: list[dict]) -> dict[str, list[str]]:
    by_id: dict[str, list[str]] = {}
    for signal in sent:
        by_id.setdefault(signal["intent"].id, []).append(signal["outcome"])
    return by_id


def test_async_and_sync_handlers_share_a_pool_and_every_outcome_is_recorded(
    background,  # noqa: F811
    finished,  # noqa: F811
):
    async def ok(intent, attempt):
        await asyncio.sleep(0.01)

    async def fail(intent, attempt):
        await asyncio.sleep(0.01)
        raise KeyError("partner down")

    async def stop(intent, attempt):
        raise Stop("gone for good")

    async def gives_up(intent, attempt):
        raise ClaimLost("not now")

    def sync(intent, attempt):
        pass

    (ok_id,) = enqueue("a.ok")
    (fail_id,) = enqueue("a.fail")
    (stop_id,) = enqueue("a.stop")
    (lost_id,) = enqueue("a.lost")
    (sync_id,) = enqueue("a.sync")
    handlers = {"a.ok": ok, "a.fail": fail, "a.stop": stop, "a.sync": sync}
    started = time.monotonic()
    assert background(pool(handlers, drain=True)).join(20) == 0

    assert (row(ok_id).state, row(ok_id).attempts, row(ok_id).claim_token) == ("completed", 1, "")
    assert (row(sync_id).state, row(sync_id).attempts) == ("completed", 1)
    failed = row(fail_id)
    assert (failed.state, failed.attempts) == ("pending", 1)
    assert failed.last_error == "KeyError: 'partner down'"
    assert failed.next_at - failed.updated_at == backoff(fail_id, 1)
    assert (failed.claim_token, failed.claim_until) == ("", None)
    stopped = row(stop_id)
    assert (stopped.state, stopped.last_error) == ("cancelled", "gone for good")
    assert row(lost_id).state == "pending"  # not in this pool: untouched
    assert outcomes(finished) == {
        ok_id: [Outcome.SUCCESS],
        fail_id: [Outcome.ERROR],
        stop_id: [Outcome.STOPPED],
        sync_id: [Outcome.SUCCESS],
    }
    assert time.monotonic() - started < 10

    # ClaimLost raised while the claim still holds: handed back, due now, attempts kept.
    assert background(pool({"a.lost": gives_up}, drain=True, timeout=1)).join(20) in (0, 1)
    released = row(lost_id)
    assert (released.state, released.claim_token, released.last_error) == ("pending", "", "")
    assert released.attempts >= 1 and released.next_at <= timezone.now()


def test_no_more_async_attempts_run_at_once_than_the_concurrency(background):  # noqa: F811
    running, most = 0, 0

    async def slow(intent, attempt):
        nonlocal running, most
        running += 1  # one event loop thread: no lock needed
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1

    ids = enqueue("a.slow", 30)
    assert background(pool({"a.slow": slow}, concurrency=5, drain=True)).join(30) == 0
    assert most == 5
    assert {(row(id).state, row(id).attempts) for id in ids} == {("completed", 1)}


def test_the_lease_is_renewed_while_a_handler_awaits(background):  # noqa: F811
    async def slow(intent, attempt):
        await asyncio.sleep(3.0)

    (id,) = enqueue("a.slow")
    # A lease of 2 s renewed every 0.25 s: a busy machine may stall a renewal, not seven.
    running = background(pool({"a.slow": slow}, lease=2.0, renew=0.25, drain=True))
    first = wait_for(lambda: row(id).claim_until, "a claim")
    wait_for(lambda: row(id).claim_until > first + timedelta(seconds=0.5), "a renewed lease")
    assert running.join(20) == 0
    assert (row(id).state, row(id).attempts) == ("completed", 1)


def test_a_claim_lost_while_awaiting_cancels_the_handler_and_drops_its_result(
    background,  # noqa: F811
    finished,  # noqa: F811
):
    seen: list[str] = []
    began = threading.Event()

    async def slow(intent, attempt):
        if intent.attempts > 1:
            return
        began.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(f"cancelled, lost={attempt.lost}")
            raise
        seen.append("not cancelled")

    (id,) = enqueue("a.slow")
    running = background(pool({"a.slow": slow}, lease=3.0, renew=0.2))
    wait_for(began.is_set, "the handler to start")  # lost before it, it would never start
    assert Intent.objects.retry_now(id)  # an administrator retries it while it awaits
    wait_for(lambda: row(id).state == "completed", "the second attempt")
    assert running.finish() == 0
    assert seen == ["cancelled, lost=True"]
    assert (row(id).attempts, row(id).last_error) == (2, "")
    assert sorted(outcomes(finished)[id]) == [Outcome.FENCED, Outcome.SUCCESS]


def test_a_stop_wakes_wait_cancelled_and_a_handler_that_finishes_in_the_grace_is_recorded(
    background,  # noqa: F811
):
    began = threading.Event()

    async def patient(intent, attempt):
        began.set()
        await attempt.wait_cancelled()
        assert attempt.cancelled.is_set() and not attempt.lost
        await asyncio.sleep(0.05)  # wind down within the grace period

    (id,) = enqueue("a.slow")
    running = background(pool({"a.slow": patient}, grace=5.0))
    # Running in the table is not yet running on the loop: a stop before the
    # coroutine starts releases the claim unstarted, which is another test.
    wait_for(began.is_set, "the handler to start")
    started = time.monotonic()
    assert running.finish() == 0
    assert time.monotonic() - started < 3
    assert (row(id).state, row(id).attempts, row(id).claim_token) == ("completed", 1, "")


def test_a_handler_still_awaiting_after_the_grace_is_cancelled_and_its_intent_released(
    background,  # noqa: F811
):
    seen: list[str] = []
    began, cancelled = threading.Event(), threading.Event()

    async def stubborn(intent, attempt):
        began.set()
        try:
            await asyncio.sleep(60)  # ignores attempt.cancelled
        except asyncio.CancelledError:
            seen.append("cancelled")
            cancelled.set()
            raise

    (id,) = enqueue("a.slow")
    running = background(pool({"a.slow": stubborn}, grace=0.3))
    # Not the row's state: a claim still waiting for the event loop's slot is
    # released unstarted, attempt taken back (tests/test_event_loop_queue.py).
    wait_for(began.is_set, "the handler to start")
    started = time.monotonic()
    assert running.finish() == 0
    assert time.monotonic() - started < 3
    assert cancelled.wait(2) and seen == ["cancelled"]
    released = row(id)
    assert (released.state, released.attempts, released.claim_token) == ("pending", 1, "")
    assert released.next_at <= timezone.now()


def test_a_sync_handler_that_returns_a_coroutine_fails_saying_to_declare_it_async(
    background,  # noqa: F811
):
    async def real(intent, attempt):
        return None

    def wrapped(intent, attempt):
        return real(intent, attempt)

    (id,) = enqueue("a.wrapped")
    assert background(pool({"a.wrapped": wrapped}, drain=True)).join(20) == 0
    failed = row(id)
    assert failed.state == "pending"
    assert "declare the handler with async def" in failed.last_error


def test_a_drain_of_a_pool_with_sync_and_async_kinds_ends_once_both_are_empty(background):  # noqa: F811
    async def quick(intent, attempt):
        await asyncio.sleep(0)

    sync_ids = enqueue("a.sync", 60)
    async_ids = enqueue("a.ok", 60)
    handlers = {"a.ok": quick, "a.sync": lambda intent, attempt: None}
    started = time.monotonic()
    assert background(pool(handlers, drain=True)).join(30) == 0
    assert time.monotonic() - started < 15
    assert {row(id).state for id in sync_ids + async_ids} == {"completed"}
