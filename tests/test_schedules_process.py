"""Real pools enqueue the due slots of the schedules whose kind they run, and only those.

Two ``run_intent_workers`` processes share one schedule of ``test.ok``: the
slot that is due when they start is enqueued once and run once. A second
schedule's kind is not among the pools' ``--kinds``: no pool enqueues it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from django_intents.models import Intent
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

SCHEDULES = {
    "tick": {"cron": "* * * * *", "kind": "test.ok", "target": "t", "payload": {"n": 1}},
    "unrun": {"cron": "* * * * *", "kind": "test.sleepy", "target": "t"},
}


def test_two_pools_enqueue_each_due_slot_once_and_run_it_once(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    intents = {"SCHEDULES": SCHEDULES, "POLL_INTERVAL": 0.05}
    workers = [start_worker("--kinds", "test.ok", intents=intents) for _ in range(2)]
    for worker in workers:
        wait_for(worker.started, "the worker to start")
    ticks = Intent.objects.filter(event_id__startswith="schedule:tick:")
    wait_for(lambda: ticks.filter(state="completed").exists(), "a slot to be enqueued and run")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.assert_clean_exit(15)

    rows = list(ticks.values_list("id", "event_id", "next_at", "state"))
    # The slot due at start, and the next one if a minute began meanwhile.
    assert 1 <= len(rows) <= 2, rows
    for _, event_id, next_at, _ in rows:
        assert event_id == f"schedule:tick:{next_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    ran = list(Effect.objects.values_list("intent_id", "note"))
    assert sorted(ran) == sorted((id, "ok 1") for id, *_, state in rows if state == "completed")
    assert not Intent.objects.filter(event_id__startswith="schedule:unrun:").exists()
