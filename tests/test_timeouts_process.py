"""SPEC §16 with real ``run_intent_workers`` processes: a stuck sync handler is given up on.

The handler is ``test.sleepy`` (tests/testapp/handlers.py) told to ignore
``attempt.cancelled``: its thread sleeps on past the timeout and the grace
period, as a handler stuck in a call without a timeout would.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_intents.models import Intent
from django_intents.store.clock import server_now
from tests.testapp.models import Effect

from .conftest import row
from .workerutil import Worker, wait_for


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """Start workers against the test database; all die at teardown."""
    workers: list[Worker] = []

    def start(*args: str, intents: dict[str, Any] | None = None) -> Worker:
        workers.append(Worker(list(args), intents or {}, {}))
        return workers[-1]

    yield start
    for worker in workers:
        worker.cleanup()


def enqueue_stuck(seconds: float, attempts: int = 1) -> str:
    """A ``test.sleepy`` whose first ``attempts`` sleep ``seconds``, deaf to cancellation."""
    payload = {"on_cancel": "ignore", "seconds": seconds, "slow_attempts": attempts}
    return Intent.objects.enqueue("test.sleepy", "e", "https://example.com/hook", payload)


def notes(id: str) -> list[str]:  # noqa: A002
    return list(Effect.objects.filter(intent_id=id).order_by("id").values_list("note", flat=True))


def test_a_stuck_sync_attempt_is_retried_and_its_late_result_dropped(start_worker):
    id = enqueue_stuck(1.0)

    worker = start_worker(
        "--until-empty", "--timeout", "30", "--kinds", "test.sleepy", "--workers", "2",
        "--timeout-per-attempt", "0.3", "--grace", "0.3",
    )  # fmt: skip
    worker.assert_clean_exit(timeout=30)

    # The first attempt's thread returned ("done 1") after it was given up on;
    # its success was dropped, and the retry (attempt 2) completed the intent.
    fresh = row(id)
    assert (fresh.state, fresh.attempts) == (Intent.State.COMPLETED, 2)
    assert sorted(notes(id)) == ["done 1", "start 1", "start 2"]
    log = worker.log
    assert "(attempt 1): timed out after 0.3 s" in log
    assert "(attempt 1): still running 0.3 s after its timeout" in log
    assert "(attempt 1): returned after it was given up on; its result dropped" in log


def test_a_thread_stuck_past_its_limits_timeout_keeps_its_worker_and_does_not_hold_the_stop(
    start_worker,
):
    id = enqueue_stuck(60, attempts=99)

    worker = start_worker(
        "--kinds", "test.sleepy", "--workers", "1", "--grace", "0.3",
        intents={"LIMITS": {"test.sleepy": {"timeout": 0.3}}},
    )  # fmt: skip
    wait_for(lambda: row(id).last_error, "the timeout recorded", timeout=30)
    fresh = row(id)
    assert (fresh.state, fresh.attempts) == (Intent.State.PENDING, 1)
    assert fresh.last_error == "timed out after 0.3 s"
    assert (fresh.claim_token, fresh.claim_until) == ("", None)
    # Due again after its backoff, the retry finds the pool's one worker still
    # stuck in the first attempt: it waits, unclaimed.
    time.sleep(max((fresh.next_at - server_now()).total_seconds(), 0) + 0.5)
    assert (row(id).state, row(id).attempts) == (Intent.State.PENDING, 1)

    stopping = time.monotonic()
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert time.monotonic() - stopping < 10, worker.log
    assert notes(id) == ["start 1"]  # the thread never returned; the process did not wait
