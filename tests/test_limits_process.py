"""``INTENTS["LIMITS"]`` across real worker processes (SPEC §10), sampled from the table.

Two ``run_intent_workers`` processes share the limits through the claim
alone; a sampler reads the running rows every 50 ms and checks, at every
sample, the caps and the order in which each target's intents were taken.
A SIGKILLed worker's slots come back when its leases expire, not before.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_intents.models import Intent
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

KIND = "test.sleepy"  # sleeps payload["seconds"], noting each start (tests/testapp/handlers.py)
SAMPLE_EVERY = 0.05


class Sampler(threading.Thread):
    """Reads the live leases of ``KIND`` every 50 ms; keeps every sample."""

    def __init__(self, order: dict[str, list[str]]) -> None:
        super().__init__(daemon=True)
        self.order = order  # each target's intents in claim order
        self.samples: list[tuple[Counter[str], dict[str, int]]] = []
        self.errors: list[BaseException] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.wait(SAMPLE_EVERY):
                now = timezone.now()
                rows = Intent.objects.filter(kind=KIND).values_list(
                    "id", "target", "state", "attempts", "claim_until"
                )
                live: Counter[str] = Counter()
                taken: dict[str, int] = {}  # per target: how many of its intents were claimed
                claimed = set()
                for id, target, state, attempts, until in rows:  # noqa: A001
                    if state == "running" and until > now:
                        live[target] += 1
                    if attempts:
                        claimed.add(id)
                for target, ids in self.order.items():
                    taken[target] = sum(1 for id in ids if id in claimed)
                    # In order: what was claimed of a target is always a prefix of its queue.
                    assert all(id in claimed for id in ids[: taken[target]]), (target, claimed)
                self.samples.append((live, taken))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


@pytest.fixture
def sampler() -> Iterator[Callable[[dict[str, list[str]]], Sampler]]:
    started: list[Sampler] = []

    def start(order: dict[str, list[str]]) -> Sampler:
        started.append(Sampler(order))
        started[-1].start()
        return started[-1]

    yield start
    for one in started:
        one.stop()


def enqueue(targets: list[str], *payloads: dict[str, Any]) -> dict[str, list[str]]:
    """One intent per entry, due 1 ms apart in that order; each target's ids in order.

    The last payload given serves every intent after it.
    """
    start = timezone.now() - timedelta(seconds=10)
    order: dict[str, list[str]] = {}
    for i, target in enumerate(targets):
        payload = payloads[min(i, len(payloads) - 1)]
        id = Intent.objects.enqueue(  # noqa: A001
            KIND, f"e{i}", target, payload, next_at=start + timedelta(milliseconds=i)
        )
        order.setdefault(target, []).append(id)
    return order


LIMITS = {"LIMITS": {KIND: {"running": 3, "per_target": 2}}, "POLL_INTERVAL": 0.05}


def test_two_workers_never_exceed_the_limits_and_take_each_target_in_order(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
    sampler: Callable[..., Sampler],
) -> None:
    targets = ["a"] * 5 + ["b"] * 4 + ["c"] * 3
    order = enqueue(targets, {"seconds": 0.3, "on_cancel": "raise"})
    watch = sampler(order)
    workers = [
        start_worker("--workers", "4", "--lease", "5", "--drain", intents=LIMITS) for _ in range(2)
    ]
    for worker in workers:
        assert worker.wait(60) == 0, worker.log
    watch.stop()

    assert watch.errors == []
    assert len(watch.samples) > 10
    for live, _ in watch.samples:
        assert max(live.values(), default=0) <= 2, live
        assert sum(live.values()) <= 3, live
    # The limits were reached, so they did hold something back.
    assert max(sum(live.values()) for live, _ in watch.samples) == 3
    rows = Intent.objects.filter(kind=KIND)
    assert {(r.state, r.attempts, r.claim_token) for r in rows} == {("completed", 1, "")}
    assert Effect.objects.filter(note="start 1").count() == len(targets)


def test_held_back_intents_start_as_soon_as_a_slot_frees(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
    sampler: Callable[..., Sampler],
) -> None:
    # Target a has 4 intents of 0.5 s and one slot: they run back to back.
    order = enqueue(["a"] * 4, {"seconds": 0.5, "on_cancel": "raise"})
    watch = sampler(order)
    limits = {"LIMITS": {KIND: {"per_target": 1}}, "POLL_INTERVAL": 0.05}
    first = start_worker("--workers", "2", "--lease", "5", "--drain", intents=limits)
    second = start_worker("--workers", "2", "--lease", "5", "--drain", intents=limits)
    assert first.wait(60) == 0, first.log
    assert second.wait(60) == 0, second.log
    watch.stop()
    assert watch.errors == []
    # Count the samples where a slot was free while an intent of a waited, once
    # the first one started: each gap is one slot handed over between two runs.
    started = next(i for i, (live, _) in enumerate(watch.samples) if live["a"])
    last = max(i for i, (_, taken) in enumerate(watch.samples) if taken["a"] < 4)
    idle = [i for i in range(started, last + 1) if not watch.samples[i][0]["a"]]
    assert max(live["a"] for live, _ in watch.samples) == 1
    # Three hand-overs; each may show as a sample or two (a claim is not instant
    # and the other pool may be the one to claim), never as a poll interval's wait.
    assert len(idle) <= 3 * 3, idle
    assert set(Intent.objects.values_list("state", flat=True)) == {"completed"}


def test_a_sigkilled_workers_slots_free_when_its_leases_expire(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    order = enqueue(
        ["a", "a"], {"seconds": 60, "slow_attempts": 1, "on_cancel": "ignore"}, {"seconds": 0.1}
    )
    first_id, second_id = order["a"]
    limits = {"LIMITS": {KIND: {"per_target": 1}}, "POLL_INTERVAL": 0.05}
    first = start_worker("--workers", "2", "--lease", "2", "--renew", "0.5", intents=limits)
    wait_for(lambda: Effect.objects.filter(note="start 1").exists(), "the first attempt")
    first.kill_group()
    killed_at = time.monotonic()
    lease_end = Intent.objects.get(id=first_id).claim_until
    assert lease_end is not None

    second = start_worker("--workers", "2", "--lease", "2", "--renew", "0.5", intents=limits)
    # While the dead worker's lease holds, its slot is taken: nothing else of a starts.
    time.sleep(max((lease_end - timezone.now()).total_seconds() - 0.3, 0))
    assert Effect.objects.count() == 1
    assert Intent.objects.get(id=second_id).state == "pending"
    wait_for(
        lambda: Intent.objects.filter(state="completed").count() == 2,
        "both intents to complete after the lease expired",
        timeout=30,
    )
    assert time.monotonic() - killed_at >= 1.0
    second.signal(signal.SIGTERM)
    second.assert_clean_exit(timeout=15)
    taken_over = Intent.objects.get(id=first_id)
    assert (taken_over.attempts, taken_over.claim_token) == (2, "")
    assert Intent.objects.get(id=second_id).attempts == 1
    # The dead worker's attempt, its quick second attempt, then the next in line.
    notes = list(Effect.objects.order_by("id").values_list("intent_id", "note"))
    assert notes == [
        (first_id, "start 1"),
        (first_id, "start 2"),
        (second_id, "start 1"),
        (second_id, "done 1"),
    ]
