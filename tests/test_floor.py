"""The claim floor: ``since=`` on the manager and ``ClaimFloor``.

A pool claims above a floor so that PostgreSQL's not-yet-vacuumed index
entries of finished intents are not walked on every claim. What must hold:
nothing below the floor is lost, a full scan finds it within a second, and a
drain never ends while something below the floor is due. The pool's side of
it is in test_worker_pool.py ("the claim floor").
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from django_intents.models import Intent
from django_intents.store.claims import Claims
from django_intents.worker.floor import FULL_SCAN_MAX, SLACK, ClaimFloor

from .conftest import T0, at, enqueue, row, snapshot


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

    def test_a_slow_full_scan_comes_round_later_so_full_scans_keep_to_their_share(self):
        """A full claim that walked half a second of dead index entries (a snapshot
        held open elsewhere keeps them) is followed by the next one only after ten
        seconds: a twentieth of the pool's time, not half of it."""
        floor, clock = self.make()
        floor.seen(None, at(10), None, took=0.5)
        clock.now += 9.99
        assert floor.since() == at(8)
        clock.now += 0.02
        assert floor.since() is None

    def test_a_quick_full_scan_comes_round_every_period_and_a_slow_one_at_most_after_the_longest(
        self,
    ):
        floor, clock = self.make()
        floor.seen(None, at(10), None, took=0.04)  # 0.8 s of its share: the period wins
        clock.now += 1.01
        assert floor.since() is None
        floor.claimed(None, at(11), Claims([]), 5, took=60.0)
        clock.now += FULL_SCAN_MAX - 0.01
        assert floor.since() == at(9)
        clock.now += 0.02
        assert floor.since() is None

    def test_a_floored_claims_duration_does_not_move_the_next_full_scan(self):
        floor, clock = self.make()
        floor.seen(None, at(10), None)
        floor.seen(at(8), at(10.5), None, took=5.0)
        clock.now += 1.01
        assert floor.since() is None

    def test_rescan_makes_the_next_claim_a_full_scan(self):
        floor, _ = self.make()
        floor.seen(None, at(10), None)
        floor.rescan()
        assert floor.since() is None

    def test_a_floored_claim_a_limit_held_back_leaves_the_floor_where_it_was(self):
        floor, _ = self.make()
        floor.seen(None, at(10), at(5))
        intents = [Intent(next_at=at(7), priority=0)]
        floor.claimed(at(5), at(10.5), Claims(intents, held_back=True), 1)
        assert floor.since() == at(5)
        floor.claimed(at(5), at(10.6), Claims(intents), 1)
        assert floor.since() == at(7)

    def test_a_full_claim_a_limit_held_back_keeps_the_pool_scanning_fully(self):
        floor, clock = self.make()
        floor.seen(None, at(10), at(5))
        clock.now += 1.5
        claimed = [Intent(next_at=at(8), priority=0)]
        floor.claimed(None, at(11), Claims(claimed, held_back=True), 1)
        # What was held back may lie below any floor: scan fully until a claim holds nothing back.
        assert floor.since() is None
        floor.claimed(None, at(11.1), Claims(claimed), 1)
        assert floor.since() == at(8)

    def test_a_full_claim_that_knows_the_first_due_intent_floors_the_pool_there(self):
        floor, clock = self.make()
        floor.seen(None, at(10), at(5))
        clock.now += 1.5
        claimed = [Intent(next_at=at(8), priority=0)]
        # PostgreSQL's exact claim: a dead partner's intent at(2) heads the queue, held back.
        floor.claimed(None, at(11), Claims(claimed, held_back=True, oldest_due=at(2)), 1)
        assert floor.since() == at(2)  # below every held-back intent, so none is lost
        clock.now += 0.5
        assert floor.since() == at(2)  # and the claims stay floored until the next full scan
        clock.now += 0.6
        assert floor.since() is None
        # Nothing due at all: as a full claim that found nothing.
        floor.claimed(None, at(12), Claims([], held_back=True, oldest_due=at(12)), 1)
        assert floor.since() == at(12) - SLACK
