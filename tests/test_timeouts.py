"""SPEC §16: an attempt that runs past its timeout is cancelled and retried as a failure.

``LIMITS[kind]["timeout"]`` and ``--timeout-per-attempt`` (the pool's
``timeout_per_attempt``). Pools run in this process with timeouts of a few
tenths of a second; test_timeouts_process.py runs real workers and signals.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django.utils import timezone
from django_prometheus.testutils import assert_metric_diff, save_registry

from django_intents import signals
from django_intents.conf import get_settings, parse
from django_intents.models import Intent
from django_intents.observability.metrics import kind_label
from django_intents.rules.limits import Limit
from django_intents.worker.pool import WorkerPool

from .conftest import external_kinds, intents, row
from .test_worker_pool import Background, pool
from .workerutil import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ("to.async", "to.sync", "to.quick", "to.limited", "to.free")
DURATION = "django_intents_handler_duration_seconds"


@pytest.fixture(autouse=True)
def timeout_kinds() -> Iterator[None]:
    with external_kinds(*KINDS):
        yield


@pytest.fixture
def background() -> Iterator[Callable[[WorkerPool], Background]]:
    """Run pools in threads (``Background``); each one is stopped at teardown."""
    started: list[Background] = []

    def start(pool: WorkerPool) -> Background:
        started.append(Background(pool))
        return started[-1]

    yield start
    for running in started:
        running.finish()


@pytest.fixture
def finished() -> Iterator[list[dict[str, Any]]]:
    """Every ``attempt_finished`` signal sent while the test runs."""
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    signals.attempt_finished.connect(receiver, dispatch_uid="test_timeouts")
    yield sent
    signals.attempt_finished.disconnect(dispatch_uid="test_timeouts")


def enqueue(kind: str, event: str = "e") -> str:
    return Intent.objects.enqueue(kind, event, "target", None)


def outcomes(finished: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(signal["kind"], signal["outcome"]) for signal in finished]


def assert_timed_out(id: str, after: float, *, backing_off: bool = True) -> None:  # noqa: A002
    """Retried as a failure: pending, the attempt counted, last_error saying so, and
    (unless the test waited longer than the backoff) not due yet."""
    fresh = row(id)
    assert (fresh.state, fresh.attempts) == (Intent.State.PENDING, 1)
    assert fresh.last_error == f"timed out after {after} s"
    assert fresh.next_at > (timezone.now() if backing_off else fresh.updated_at)
    assert (fresh.claim_token, fresh.claim_until) == ("", None)


# -- async handlers: the task is cancelled ---------------------------------------------


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried_as_a_failure(
    background, finished
):
    cancelled = threading.Event()

    async def forever(intent, attempt):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    id = enqueue("to.async")
    registry = save_registry()
    started = time.monotonic()

    run = background(pool({"to.async": forever}, drain=True, timeout_per_attempt=0.3))

    assert run.join() == 0
    assert cancelled.is_set()
    assert time.monotonic() - started < 5
    assert_timed_out(id, 0.3)
    assert outcomes(finished) == [("to.async", "timeout")]
    assert 0.3 <= finished[0]["duration"] < 2
    assert_metric_diff(
        registry,
        1,
        f"{DURATION}_count",
        kind=kind_label("to.async"),
        outcome="timeout",
        database="default",
    )


def test_a_timed_out_attempt_is_logged_like_a_failure_with_when_it_runs_again(background, caplog):
    async def forever(intent, attempt):
        await asyncio.sleep(3600)

    id = enqueue("to.async")
    with caplog.at_level(logging.WARNING, logger="django_intents.worker"):
        assert (
            background(pool({"to.async": forever}, drain=True, timeout_per_attempt=0.2)).join() == 0
        )
    assert_timed_out(id, 0.2)
    lines = [r.getMessage() for r in caplog.records if "timed out after 0.2 s" in r.getMessage()]
    assert any("retry in" in line for line in lines), lines


def test_an_async_handler_that_swallows_the_cancellation_still_times_out(background, finished):
    async def stubborn(intent, attempt):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return  # swallowed: the attempt still ran past its time

    id = enqueue("to.async")
    assert background(pool({"to.async": stubborn}, drain=True, timeout_per_attempt=0.2)).join() == 0
    assert_timed_out(id, 0.2)
    assert outcomes(finished) == [("to.async", "timeout")]


def test_an_async_handler_within_its_timeout_completes(background, finished):
    async def quick(intent, attempt):
        await asyncio.sleep(0.01)

    id = enqueue("to.async")
    assert background(pool({"to.async": quick}, drain=True, timeout_per_attempt=5)).join() == 0
    assert row(id).state == Intent.State.COMPLETED
    assert outcomes(finished) == [("to.async", "success")]


# -- sync handlers: attempt.cancelled, then the grace period -----------------------------


@pytest.mark.parametrize("then", ["return", "check"])
def test_a_sync_handler_that_stops_within_the_grace_still_fails_with_a_timeout(
    background, finished, then
):
    seen: list[float] = []

    def patient(intent, attempt):
        started = time.monotonic()
        assert attempt.cancelled.wait(10)
        seen.append(time.monotonic() - started)
        if then == "check":
            attempt.check()  # ClaimLost: a timeout all the same, not a release at shutdown
        # Returning normally after the timeout: its result is dropped all the same.

    id = enqueue("to.sync")
    handlers = {"to.sync": patient}
    run = background(pool(handlers, drain=True, timeout_per_attempt=0.2, grace=10))
    assert run.join() == 0

    # attempt.cancelled was set at the timeout, which runs from the attempt's start in
    # the pool: the handler's own clock starts a little later on a busy machine.
    assert 0.1 <= seen[0] < 2
    assert_timed_out(id, 0.2)
    assert outcomes(finished) == [("to.sync", "timeout")]
    assert finished[0]["duration"] < 2  # recorded when it returned, not after the grace


def test_a_sync_handler_stuck_past_the_grace_is_retried_and_its_late_result_dropped(
    background, finished, caplog
):
    calls: list[tuple[int, bool]] = []  # (attempt, cancelled when it returned)

    def stuck_once(intent, attempt):
        if intent.attempts == 1:
            time.sleep(1.0)  # deaf to attempt.cancelled
        calls.append((intent.attempts, attempt.cancelled.is_set()))

    id = enqueue("to.sync")
    caplog.set_level(logging.INFO, logger="django_intents")
    handlers = {"to.sync": stuck_once}
    run = background(
        pool(handlers, until_empty=True, timeout=30, timeout_per_attempt=0.2, grace=0.2)
    )

    # Given up on at timeout + grace, long before the sleep ends: retried as a failure.
    wait_for(lambda: outcomes(finished) == [("to.sync", "timeout")], "the timeout recorded")
    assert calls == []
    assert row(id).last_error == "timed out after 0.2 s"
    assert run.join() == 0

    # The stale thread's success was dropped; the second attempt completed the intent.
    assert calls == [(1, True), (2, False)]
    fresh = row(id)
    assert (fresh.state, fresh.attempts) == (Intent.State.COMPLETED, 2)
    assert outcomes(finished) == [("to.sync", "timeout"), ("to.sync", "success")]
    assert "returned after it was given up on; its result dropped" in caplog.text


def test_a_stuck_thread_keeps_its_worker_until_it_returns(background, finished):
    events: list[tuple[str, float]] = []

    def stuck(intent, attempt):
        if intent.attempts == 1:
            time.sleep(1.0)
            events.append(("stuck returned", time.monotonic()))

    def quick(intent, attempt):
        events.append(("quick started", time.monotonic()))

    stuck_id = enqueue("to.sync")
    quick_id = enqueue("to.quick")  # behind it in claim order
    handlers = {"to.sync": stuck, "to.quick": quick}
    run = background(
        pool(handlers, workers=1, drain=True, timeout_per_attempt=0.2, grace=0.1, timeout=30)
    )
    assert run.join() == 0

    # The stuck attempt was given up on at 0.3 s, but its thread was the only
    # worker: nothing else ran before it returned.
    assert [name for name, _ in events] == ["stuck returned", "quick started"]
    assert outcomes(finished)[0] == ("to.sync", "timeout")
    assert row(stuck_id).last_error == "timed out after 0.2 s"
    assert row(quick_id).state == Intent.State.COMPLETED


def test_a_pool_with_a_stuck_thread_stops_within_its_grace(background, finished):
    let_go = threading.Event()

    def deaf(intent, attempt):
        let_go.wait(30)

    id = enqueue("to.sync")
    run = background(pool({"to.sync": deaf}, timeout_per_attempt=0.2, grace=0.2))
    try:
        wait_for(lambda: outcomes(finished) == [("to.sync", "timeout")], "the timeout recorded")
        stopping = time.monotonic()
        assert run.finish(timeout=10) == 0
        assert time.monotonic() - stopping < 5
    finally:
        let_go.set()
    assert_timed_out(id, 0.2, backing_off=False)


def test_a_timeout_uses_the_last_attempt_under_max_attempts(background, finished):
    def deaf(intent, attempt):
        time.sleep(0.6)

    id = enqueue("to.sync")
    settings = intents(EXTERNAL_KINDS=list(KINDS), MAX_ATTEMPTS=1)
    with override_settings(INTENTS=settings):
        run = background(pool({"to.sync": deaf}, drain=True, timeout_per_attempt=0.2, grace=0.1))
        assert run.join() == 0
    fresh = row(id)
    assert (fresh.state, fresh.attempts) == (Intent.State.CANCELLED, 1)
    assert fresh.last_error == "timed out after 0.2 s"
    assert outcomes(finished) == [("to.sync", "timeout")]


def test_the_time_of_an_attempt_starts_when_its_handler_does(background, finished):
    """Claims waiting for the one worker are not timed out while they wait."""

    def slowish(intent, attempt):
        time.sleep(0.15)

    ids = [enqueue("to.sync", f"e{i}") for i in range(4)]
    run = background(pool({"to.sync": slowish}, workers=1, drain=True, timeout_per_attempt=0.4))
    assert run.join() == 0
    assert all(row(id).state == Intent.State.COMPLETED for id in ids)
    assert {outcome for _, outcome in outcomes(finished)} == {"success"}


# -- LIMITS[kind]["timeout"] -------------------------------------------------------------


def test_a_kinds_limits_timeout_overrides_the_pools_default(background, finished):
    def patient(intent, attempt):
        attempt.cancelled.wait(0.5)

    limited, free = enqueue("to.limited"), enqueue("to.free")
    settings = intents(EXTERNAL_KINDS=list(KINDS), LIMITS={"to.limited": {"timeout": 0.2}})
    with override_settings(INTENTS=settings):
        assert get_settings().limits == {}  # a timeout alone limits no claim
        assert get_settings().timeouts == {"to.limited": 0.2}
        handlers = {"to.limited": patient, "to.free": patient}
        assert background(pool(handlers, drain=True, timeout_per_attempt=5)).join() == 0
    assert_timed_out(limited, 0.2)
    assert row(free).state == Intent.State.COMPLETED
    assert sorted(outcomes(finished)) == [("to.free", "success"), ("to.limited", "timeout")]


def test_a_limits_entry_can_hold_caps_and_a_timeout():
    built, errors = parse(
        {"LIMITS": {"a": {"running": 2, "timeout": 30}, "b": {"timeout": 1.5}, "c": {"running": 1}}}
    )
    assert errors == []
    assert built.limits == {"a": Limit(running=2), "c": Limit(running=1)}
    assert built.timeouts == {"a": 30.0, "b": 1.5}
    assert isinstance(built.timeouts["a"], float)


@pytest.mark.parametrize("value", [0, -1, True, "5", None, float("nan"), float("inf"), [1]])
def test_a_bad_timeout_is_one_error_naming_the_key(value):
    built, errors = parse({"LIMITS": {"k": {"timeout": value}}})
    assert len(errors) == 1
    message = str(errors[0])
    assert message.startswith("INTENTS['LIMITS'] ['k']['timeout'] must be a positive number")
    assert f"not {value!r}" in message
    assert (built.limits, built.timeouts) == ({}, {})


def test_a_bad_timeout_fails_the_system_check():
    with (
        override_settings(INTENTS=intents(LIMITS={"k": {"timeout": 0}})),
        pytest.raises(SystemCheckError, match=r"INTENTS\['LIMITS'\].*\['timeout'\]"),
    ):
        call_command("check")
