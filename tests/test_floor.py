"""The claim floor: ``since=`` on the manager, ``ClaimFloor``, and a pool that uses it.

A pool claims above a floor so that PostgreSQL's not-yet-vacuumed index
entries of finished intents are not walked on every claim. What must hold:
nothing below the floor is lost, a full scan finds it within a second, and a
drain never ends while something below the floor is due.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_intents.floor import ClaimFloor
from django_intents.models import Intent
from django_intents.worker import WorkerPool

from .conftest import T0, at, enqueue, row, snapshot
from .workerutil import wait_for


def add(event_id: str, next_at: datetime, kind: str = "webhook") -> str:
    return Intent.objects.enqueue(kind, event_id, "t", next_at=next_at, now=T0)


class TestSince:
    pytestmark = pytest.mark.django_db

    def test_claim_many_since_leaves_out_intents_due_before_it(self):
        old = add("old", at(1))
        new = add("new", at(5))
        claimed = Intent.objects.claim_many(10, now=at(10), since=at(3))
        assert [intent.id for intent in claimed] == [new]
        assert row(old).state == Intent.State.PENDING
        assert [i.id for i in Intent.objects.claim_many(10, now=at(10))] == [old]

    def test_claim_many_since_is_inclusive(self):
        id = add("only", at(3))
        assert [i.id for i in Intent.objects.claim_many(1, now=at(10), since=at(3))] == [id]

    def test_claim_many_since_leaves_out_an_expired_lease_on_an_old_intent(self):
        id = add("stale", at(1))
        Intent.objects.claim(now=at(1), lease=5)
        assert Intent.objects.claim_many(1, now=at(60), since=at(30)) == []
        assert row(id).attempts == 1
        assert [i.id for i in Intent.objects.claim_many(1, now=at(60))] == [id]

    def test_has_due_since_agrees_with_claim_many_since(self):
        add("old", at(1))
        assert Intent.objects.has_due(now=at(10), since=at(3)) is False
        assert Intent.objects.has_due(now=at(10), since=at(1)) is True
        add("new", at(5), kind="push")
        assert Intent.objects.has_due(now=at(10), since=at(3), kinds=["webhook"]) is False
        assert Intent.objects.has_due(now=at(10), since=at(3), kinds=["push"]) is True

    @pytest.mark.parametrize(
        ("since", "error", "message"),
        [
            (T0.replace(tzinfo=None), ValueError, "since must be an aware datetime"),
            ("2026-01-01", TypeError, "since must be a datetime, not str"),
        ],
    )
    def test_a_bad_since_is_refused_and_nothing_is_claimed(self, since, error, message):
        enqueue()
        before = snapshot()
        with pytest.raises(error, match=message):
            Intent.objects.claim_many(1, now=at(10), since=since)
        with pytest.raises(error, match=message):
            Intent.objects.has_due(now=at(10), since=since)
        assert snapshot() == before


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestClaimFloor:
    def make(self) -> tuple[ClaimFloor, FakeClock]:
        clock = FakeClock()
        return ClaimFloor(every=1.0, slack=timedelta(seconds=2), clock=clock), clock

    def test_the_first_claim_is_a_full_scan(self):
        floor, _ = self.make()
        assert floor.since() is None

    def test_a_full_scan_that_found_nothing_sets_the_floor_to_now_less_the_slack(self):
        floor, _ = self.make()
        floor.seen(None, at(10), None)
        assert floor.since() == at(8)

    def test_a_full_scan_sets_the_floor_to_the_oldest_intent_found(self):
        floor, _ = self.make()
        floor.seen(None, at(10), at(-3600))
        assert floor.since() == at(-3600)

    def test_an_intent_newer_than_now_less_the_slack_keeps_the_slack(self):
        floor, _ = self.make()
        floor.seen(None, at(10), at(9.5))
        assert floor.since() == at(8)

    def test_a_floored_claim_only_raises_the_floor(self):
        floor, _ = self.make()
        floor.seen(None, at(10), at(5))
        floor.seen(at(5), at(10.5), at(7))
        assert floor.since() == at(7)
        floor.seen(at(7), at(10.6), at(6))  # below what was looked at: no change
        assert floor.since() == at(7)

    def test_a_full_scan_comes_round_every_period_and_may_lower_the_floor(self):
        floor, clock = self.make()
        floor.seen(None, at(10), None)
        clock.now += 0.99
        assert floor.since() == at(8)
        clock.now += 0.02
        assert floor.since() is None
        floor.seen(None, at(11), at(-100))  # an expired lease on an old intent
        assert floor.since() == at(-100)

    def test_rescan_makes_the_next_claim_a_full_scan(self):
        floor, _ = self.make()
        floor.seen(None, at(10), None)
        floor.rescan()
        assert floor.since() is None


def run_pool(handlers: dict[str, Callable[..., Any]], **kwargs: Any) -> tuple[WorkerPool, Any]:
    pool = WorkerPool(handlers=handlers, handle_signals=False, poll_interval=0.05, **kwargs)
    result: dict[str, int] = {}

    def target() -> None:
        try:
            result["status"] = pool.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="test-floor-pool")
    thread.start()
    return pool, (thread, result)


def finish(handle: Any, pool: WorkerPool, *, stop: bool) -> int:
    thread, result = handle
    if stop:
        pool.stop()
    thread.join(30)
    assert not thread.is_alive(), "the pool still runs after 30 s"
    return result["status"]


@pytest.mark.django_db(transaction=True)
def test_a_drain_runs_an_intent_written_below_its_floor_before_it_ends():
    ran: list[str] = []

    def first(intent: Intent, attempt: Any) -> None:
        ran.append(intent.event_id)
        # Back-dated, written after the pool's floor was set above it.
        Intent.objects.enqueue(
            "f.job", "backdated", "t", next_at=timezone.now() - timedelta(hours=1)
        )

    def job(intent: Intent, attempt: Any) -> None:
        ran.append(intent.event_id)

    Intent.objects.enqueue("f.first", "first", "t")
    pool, handle = run_pool({"f.first": first, "f.job": job}, workers=1, drain=True)
    assert finish(handle, pool, stop=False) == 0
    assert ran == ["first", "backdated"]
    assert set(Intent.objects.values_list("state", flat=True)) == {Intent.State.COMPLETED}


@pytest.mark.django_db(transaction=True)
def test_a_pool_rescues_an_expired_lease_on_an_intent_older_than_its_floor():
    ran: list[datetime] = []
    long_ago = timezone.now() - timedelta(hours=1)
    id = Intent.objects.enqueue("f.job", "stale", "t", next_at=long_ago)
    # A worker that died holding it: its lease runs out 1.5 s from now.
    assert Intent.objects.claim(lease=1.5).id == id
    pool, handle = run_pool({"f.job": lambda intent, attempt: ran.append(timezone.now())})
    expires = row(id).claim_until
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "the rescue", timeout=10)
    assert finish(handle, pool, stop=True) == 0
    assert len(ran) == 1
    # Found by a full scan, at most FULL_SCAN_EVERY (1 s) plus a poll after expiry.
    assert ran[0] - expires < timedelta(seconds=3)
    assert row(id).attempts == 2
