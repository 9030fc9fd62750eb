"""Priority in a real worker process (SPEC §11): a backlog does not delay an urgent intent.

One pool with one worker drains a backlog of ``test.ok`` intents of priority
0; an intent of priority 50 enqueued in the middle starts before all but the
few intents the pool had already claimed when it was enqueued. On PostgreSQL
this is the pool's listener telling its claims (``PRIORITY_CHANNEL``); on
SQLite and MariaDB every claim walks every priority.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from django_intents.models import Intent
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

KIND = "test.ok"
BACKLOG = 600
# What one worker may hold when the urgent intent commits: the one it runs,
# one queued for it, and one claim of two in flight.
HELD = 4


def test_an_urgent_intent_overtakes_a_backlog_within_one_claim(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    items = [{"kind": KIND, "event_id": f"backlog-{i}", "target": "t"} for i in range(BACKLOG)]
    Intent.objects.enqueue_many(items)
    worker = start_worker("--workers", "1", "--lease", "5", intents={"POLL_INTERVAL": 0.05})
    wait_for(lambda: Effect.objects.count() >= 50, "the backlog to be under way")
    urgent = Intent.objects.enqueue(KIND, "urgent", "t", priority=50)
    started_before = Effect.objects.count()

    wait_for(lambda: Effect.objects.filter(intent_id=urgent).exists(), "the urgent intent to run")
    ran = Effect.objects.get(intent_id=urgent).pk
    overtaken_by = Effect.objects.filter(pk__lt=ran).count() - started_before
    assert overtaken_by <= HELD, f"{overtaken_by} backlog intents started before the urgent one"
    assert Effect.objects.count() < BACKLOG  # it did not wait for the backlog to drain

    wait_for(lambda: Effect.objects.count() == BACKLOG + 1, "the backlog to drain", timeout=60)
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)
    assert set(Intent.objects.values_list("state", "attempts")) == {("completed", 1)}
