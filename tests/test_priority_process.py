"""Priority in a real worker process (SPEC §11): a backlog does not delay an urgent intent.

One pool with one worker drains a backlog of 5 ms intents of priority 0; an
intent of priority 50 enqueued in the middle starts before all but the few
intents the pool started while the claim that brought it was in flight. The
pool's local queue holds about 20 of the backlog then (a tenth of a second of
its rate, ``demand.QUEUE_FOR``): the urgent intent goes ahead of them
(``demand.LocalQueue``). On PostgreSQL the pool's listener tells its claims
(``PRIORITY_CHANNEL``); on SQLite and MariaDB every claim walks every priority.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from django_intents.models import Intent
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

KIND = "test.sleepy"
BACKLOG = 300
SLEEP = {"seconds": 0.005}
# What one worker may start before the urgent intent: the one it runs, and
# those it starts while the next claim (the urgent intent's) is in flight.
HELD = 6


def started() -> int:
    return Effect.objects.filter(note__startswith="start").count()


def test_an_urgent_intent_overtakes_a_backlog_within_one_claim(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    items = [
        {"kind": KIND, "event_id": f"backlog-{i}", "target": "t", "payload": SLEEP}
        for i in range(BACKLOG)
    ]
    Intent.objects.enqueue_many(items)
    worker = start_worker("--workers", "1", "--lease", "5", intents={"POLL_INTERVAL": 0.05})
    wait_for(lambda: started() >= 50, "the backlog to be under way")
    urgent = Intent.objects.enqueue(KIND, "urgent", "t", priority=50, payload=SLEEP)
    started_before = started()

    wait_for(lambda: Effect.objects.filter(intent_id=urgent).exists(), "the urgent intent to run")
    ran = Effect.objects.filter(intent_id=urgent).order_by("pk")[0].pk
    overtaken_by = Effect.objects.filter(pk__lt=ran, note__startswith="start").count()
    overtaken_by -= started_before
    assert overtaken_by <= HELD, f"{overtaken_by} backlog intents started before the urgent one"
    assert started() < BACKLOG  # it did not wait for the backlog to drain

    # Completed, not only started: a stop would cancel a 5 ms sleep still under way.
    done = Intent.objects.filter(state=Intent.State.COMPLETED)
    wait_for(lambda: done.count() == BACKLOG + 1, "the backlog to drain", timeout=60)
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert set(Intent.objects.values_list("state", "attempts")) == {("completed", 1)}
