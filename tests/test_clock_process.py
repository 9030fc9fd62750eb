"""Leases judged by the database's clock, by workers whose own clocks are wrong (SPEC §12).

Each worker here runs with its clock a minute off the database's: more than
any lease in these tests. Judged by its own clock, the one ahead would take
over a live lease at once, and the one behind would leave an expired lease
to its dead holder for a minute more.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_intents.models import Intent
from django_intents.store.clock import server_now

from .skew import skewed
from .workerutil import Worker, wait_for

SKEW = 60
FAST = {"POLL_INTERVAL": 0.05}
SHORT = ["--lease", "3", "--renew", "1"]


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``run_intent_workers`` with its clock ``skew`` seconds off; killed at teardown."""
    workers: list[Worker] = []

    def start(*args: str, skew: int, intents: dict[str, Any]) -> Worker:
        workers.append(Worker(list(args), intents, skewed(skew)))
        return workers[-1]

    yield start
    for worker in workers:
        worker.cleanup()


def test_a_worker_whose_clock_runs_ahead_leaves_a_live_lease_alone(start_worker):
    Intent.objects.enqueue("test.ok", "held", "t")
    [held] = Intent.objects.claim_many(1, lease=30, kinds=["test.ok"])
    worker = start_worker("--workers", "2", *SHORT, skew=SKEW, intents=FAST)

    # The worker is running and claiming: it takes a new intent of the same kind...
    fresh_id = Intent.objects.enqueue("test.sleepy", "fresh", "t", {"seconds": 0.5})
    running = wait_for(
        lambda: Intent.objects.filter(id=fresh_id, state="running").first(), "the fresh claim"
    )
    # ...and stamps its lease by the database's clock, not a minute ahead.
    assert running.claim_until is not None
    lease_left = (running.claim_until - server_now()).total_seconds()
    assert 0 < lease_left <= 3 + 1, lease_left
    wait_for(
        lambda: Intent.objects.filter(id=fresh_id, state="completed").exists(), "the fresh one"
    )
    time.sleep(0.5)  # ten more polls of the held intent's kind

    stored = Intent.objects.get(id=held.id)
    assert (stored.state, stored.claim_token, stored.attempts) == (
        "running",
        held.claim_token,
        1,
    )
    completed = Intent.objects.get(id=fresh_id)
    assert abs((completed.updated_at - server_now()).total_seconds()) < 10
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert Intent.objects.get(id=held.id).claim_token == held.claim_token


def test_a_worker_whose_clock_runs_behind_takes_over_an_expired_lease_on_time(start_worker):
    orphan_id = Intent.objects.enqueue("test.ok", "orphan", "t")
    # Claimed by a worker that then died: nobody renews this two-second lease.
    [orphan] = Intent.objects.claim_many(1, lease=2, kinds=["test.ok"])
    assert orphan.claim_until is not None
    worker = start_worker("--workers", "2", *SHORT, skew=-SKEW, intents=FAST)

    done = wait_for(
        lambda: Intent.objects.filter(id=orphan_id, state="completed").first(),
        "the expired lease to be taken over",
        timeout=15,
    )
    assert done.attempts == 2
    # Taken over after the lease ended by the database's clock, and well
    # before the worker's own clock would have seen it end.
    assert orphan.claim_until <= done.updated_at < orphan.claim_until + timedelta(seconds=10)
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert Intent.objects.filter(state="running").count() == 0
