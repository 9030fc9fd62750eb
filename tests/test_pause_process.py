"""Pausing a kind across two real worker processes (SPEC §11), sampled from the table.

Both pools run ``test.sleepy`` and ``test.ok``. A pause of ``test.sleepy``
reaches both at their next claim: intents of the kind that fall due after it,
and intents enqueued after it, are never claimed while it lasts, although both
pools are idle and polling every 50 ms; the attempts already running finish
normally; ``test.ok`` keeps running. A resume restarts the kind.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone

from django_intents.models import Intent
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

PAUSED, OTHER = "test.sleepy", "test.ok"
INTENTS = {"POLL_INTERVAL": 0.05}
SAMPLE_EVERY = 0.05


def enqueue(kind: str, event: str, seconds: float = 0.1, due_in: float = 0.0) -> str:
    payload = {"seconds": seconds, "on_cancel": "ignore"}
    next_at = timezone.now() + timedelta(seconds=due_in)
    return Intent.objects.enqueue(kind, event, "t", payload, next_at=next_at)


def states(ids: list[str]) -> set[tuple[str, int, str]]:
    rows = Intent.objects.filter(id__in=ids).values_list("state", "attempts", "claim_token")
    return set(rows)


def completed(ids: list[str]) -> bool:
    return states(ids) == {("completed", 1, "")}


def test_a_pause_stops_both_pools_at_their_next_claim_and_a_resume_restarts_them(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    workers = [start_worker("--workers", "2", "--lease", "5", intents=INTENTS) for _ in range(2)]
    for worker in workers:
        wait_for(worker.started, "the worker to start")
    running = [enqueue(PAUSED, f"running-{i}", seconds=1.0) for i in range(2)]
    wait_for(lambda: Effect.objects.filter(note="start 1").count() == 2, "both to start")

    # Already in the table, due only after the pause: a claim that did not
    # skip the kind would take them within a poll interval of falling due.
    falls_due = [enqueue(PAUSED, f"later-{i}", due_in=0.5) for i in range(3)]
    assert Intent.objects.pause(PAUSED) is True
    paused_at = time.monotonic()
    enqueued = [enqueue(PAUSED, f"after-{i}") for i in range(2)]
    others = [enqueue(OTHER, f"other-{i}") for i in range(2)]
    held = falls_due + enqueued

    assert states(held) == {("pending", 0, "")}  # enqueue still records
    wait_for(lambda: completed(others), "the other kind to keep running")
    wait_for(lambda: completed(running), "the running attempts to finish", timeout=10)
    assert Effect.objects.filter(intent_id__in=running, note="done 1").count() == 2
    assert time.monotonic() > paused_at + 0.5  # the first three have fallen due
    samples, until = 0, time.monotonic() + 1.0  # then 20 poll turns of two idle pools
    while time.monotonic() < until:
        assert states(held) == {("pending", 0, "")}
        assert all(worker.proc.poll() is None for worker in workers)
        samples += 1
        time.sleep(SAMPLE_EVERY)
    assert samples > 10
    assert not Effect.objects.filter(intent_id__in=held).exists()

    assert Intent.objects.resume(PAUSED) is True
    wait_for(lambda: completed(held), "the resumed kind to run", timeout=10)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.assert_clean_exit(timeout=15)


def test_pausing_one_kind_leaves_the_others_running_in_both_pools(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    assert Intent.objects.pause(OTHER) is True
    workers = [start_worker("--workers", "1", "--lease", "5", intents=INTENTS) for _ in range(2)]
    held = [enqueue(OTHER, f"held-{i}") for i in range(2)]
    # One slot per pool: the two attempts run at the same time only if both pools claim.
    running = [enqueue(PAUSED, f"running-{i}", seconds=1.0) for i in range(2)]

    def both_started_none_done() -> bool:
        notes = set(Effect.objects.filter(intent_id__in=running).values_list("intent_id", "note"))
        return notes == {(id, "start 1") for id in running}

    wait_for(both_started_none_done, "both pools to run the kind that is not paused")
    wait_for(lambda: completed(running), "the attempts to finish", timeout=10)
    assert states(held) == {("pending", 0, "")}
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.assert_clean_exit(timeout=15)
