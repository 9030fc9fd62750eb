"""Schedules (SPEC §11): ``enqueue_due`` makes each slot one intent, whoever calls it.

Time is driven by ``now=``; "pools" are callers of ``enqueue_due`` interleaved
in one thread, or real threads with their own connections. A real pool
process is in ``test_schedules_process.py``, DST in ``test_schedules_dst.py``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.test import override_settings
from django.utils import timezone

from django_intents import intent_id
from django_intents.maintenance.schedules import MAX_CATCH_UP
from django_intents.models import Intent
from django_intents.schedules import enqueue_due
from django_intents.worker import housekeeping
from django_intents.worker.housekeeping import ScheduleTick

from .conftest import T0, at, intents, snapshot

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def every_minute(catch_up: str = "latest", **extra: Any) -> Any:
    entry = {"cron": "* * * * *", "kind": "job", "target": "t", "catch_up": catch_up, **extra}
    return override_settings(INTENTS=intents(SCHEDULES={"tick": entry}))


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def slots(name: str = "tick") -> list[datetime]:
    """The slot starts of ``name``'s intents, from their event ids, oldest first."""
    rows = Intent.objects.filter(event_id__startswith=f"schedule:{name}:")
    found = [datetime.strptime(e.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for e in
             rows.values_list("event_id", flat=True)]  # fmt: skip
    return sorted(moment.replace(tzinfo=UTC) for moment in found)


def minutes(*offsets: int) -> list[datetime]:
    return [T0 + offset * MINUTE for offset in offsets]


@every_minute(payload={"report": "daily"})
def test_a_due_slot_becomes_an_intent_named_after_the_slot_and_due_at_its_start():
    [id] = enqueue_due(now=at(10))
    intent = Intent.objects.get()
    assert intent.id == id == intent_id("job", "schedule:tick:2026-01-01T12:00:00Z", "t")
    assert (intent.kind, intent.target, intent.payload) == ("job", "t", {"report": "daily"})
    assert (intent.state, intent.next_at, intent.attempts) == ("pending", T0, 0)


@every_minute()
def test_calling_again_finds_the_slot_and_writes_nothing(django_assert_num_queries):
    first = enqueue_due(now=at(1))
    before = snapshot()
    with django_assert_num_queries(1):  # one read by primary key, no insert
        assert enqueue_due(now=at(30)) == first
    assert snapshot() == before


@every_minute()
def test_three_interleaved_pools_over_ten_minutes_make_exactly_one_intent_per_slot():
    # Each pool ticks about once a second, out of step with the others.
    calls = sorted((second + phase, pool) for pool, phase in enumerate((0.0, 0.3, 0.7))
                   for second in range(1, 600))  # fmt: skip
    returned: Counter[str] = Counter()
    for second, _ in calls:
        returned.update(enqueue_due(now=at(second)))
    assert slots() == minutes(*range(10))
    assert Intent.objects.count() == 10
    assert set(returned) == set(Intent.objects.values_list("id", flat=True))


@pytest.mark.django_db(transaction=True)
@every_minute()
def test_three_pools_racing_on_their_own_connections_make_exactly_one_intent_per_slot():
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def pool() -> None:
        try:
            start.wait()
            for minute in range(10):
                for second in (1, 30, 59):  # the same instants in every pool: a race per slot
                    enqueue_due(now=at(minute * 60 + second))
        except BaseException as exc:  # surfaced to the test thread below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=pool) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert slots() == minutes(*range(10))
    assert Intent.objects.count() == 10


def test_a_slot_stays_due_for_sixty_seconds_then_is_missed():
    with override_settings(INTENTS=intents(SCHEDULES={"tick": {
            "cron": "0 * * * *", "kind": "job", "target": "t", "catch_up": "none"}})):  # fmt: skip
        assert len(enqueue_due(now=at(60))) == 1  # started exactly 60 s ago: due
        Intent.objects.all().delete()
        assert enqueue_due(now=at(60.001)) == []  # later: missed, and "none" skips it
    assert Intent.objects.count() == 0


@every_minute()
def test_two_slots_in_one_minute_window_are_both_due():
    enqueue_due(now=at(60))
    assert slots() == minutes(0, 1)


# -- catch-up after an hour down ---------------------------------------------------------


def down_for(minutes_down: int, catch_up: str) -> list[str]:
    """A pool enqueues slot T0, then nothing runs until 30 s into minute ``minutes_down``."""
    with every_minute(catch_up):
        enqueue_due(now=at(5))
        return enqueue_due(now=at(minutes_down * 60 + 30))


def test_after_an_hour_down_latest_enqueues_the_most_recent_missed_slot_and_the_due_one():
    ids = down_for(60, "latest")
    assert slots() == minutes(0, 59, 60)
    assert len(ids) == 2


def test_after_an_hour_down_all_enqueues_every_missed_slot():
    ids = down_for(60, "all")
    assert slots() == minutes(*range(61))
    assert len(ids) == 60


def test_after_an_hour_down_none_enqueues_only_the_due_slot():
    ids = down_for(60, "none")
    assert slots() == minutes(0, 60)
    assert len(ids) == 1


def test_all_catches_up_at_most_the_hundred_most_recent_missed_slots():
    down_for(180, "all")
    assert slots() == minutes(0, *range(180 - MAX_CATCH_UP, 181))
    assert Intent.objects.count() == 1 + MAX_CATCH_UP + 1


def test_catch_up_starts_after_the_latest_slot_intent_whatever_its_state():
    with every_minute("all"):
        enqueue_due(now=at(5))
        intent = Intent.objects.claim(now=at(6))
        Intent.objects.complete(intent.id, intent.claim_token, now=at(7))
        enqueue_due(now=at(57 * 60 + 5))  # slot 57 due; 1..56 missed and caught up
        Intent.objects.cancel(Intent.objects.get(next_at=minutes(57)[0]).id, now=at(57 * 60 + 6))
        enqueue_due(now=at(60 * 60 + 30))
    assert slots() == minutes(*range(61))


def test_a_pool_back_before_the_next_slot_misses_nothing():
    with every_minute("latest"):
        enqueue_due(now=at(5))
        enqueue_due(now=at(61))  # slot 1 due
        enqueue_due(now=at(150))  # slot 2 due
    assert slots() == minutes(0, 1, 2)


# -- a schedule with no slot intent yet --------------------------------------------------

HOURLY = {"cron": "0 * * * *", "kind": "job", "target": "t"}


@pytest.mark.parametrize(("catch_up", "expected"), [("latest", [T0]), ("all", [T0]), ("none", [])])
def test_a_new_schedule_enqueues_its_most_recent_slot_unless_catch_up_is_none(catch_up, expected):
    with override_settings(INTENTS=intents(SCHEDULES={"h": {**HOURLY, "catch_up": catch_up}})):
        enqueue_due(now=at(30 * 60))
    assert slots("h") == expected


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_a_new_schedule_with_a_due_slot_enqueues_only_that_slot(catch_up):
    with override_settings(INTENTS=intents(SCHEDULES={"h": {**HOURLY, "catch_up": catch_up}})):
        enqueue_due(now=at(3600 + 20))
    assert slots("h") == [T0 + timedelta(hours=1)]


# -- which schedules, and what it costs ---------------------------------------------------


def test_without_schedules_it_makes_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert enqueue_due(now=at(1)) == []


def test_only_the_schedules_of_the_given_kinds_are_enqueued(django_assert_num_queries):
    two = {"a": {**HOURLY, "kind": "job"}, "b": {**HOURLY, "kind": "push"}}
    with override_settings(INTENTS=intents(SCHEDULES=two)):
        with django_assert_num_queries(0):  # a pool that runs neither kind pays nothing
            assert enqueue_due(now=at(5), kinds=["webhook"]) == []
        enqueue_due(now=at(5), kinds=["push"])
    assert list(Intent.objects.values_list("kind", "event_id")) == [
        ("push", "schedule:b:2026-01-01T12:00:00Z")
    ]


@every_minute()
def test_a_single_string_for_kinds_is_refused_and_writes_nothing():
    with pytest.raises(TypeError, match="kinds must be a collection"):
        enqueue_due(now=at(1), kinds="job")
    assert Intent.objects.count() == 0


def test_a_broken_schedule_setting_is_refused_and_writes_nothing():
    broken = {"tick": {"cron": "* * * *", "kind": "job", "target": "t"}}
    with (
        override_settings(INTENTS=intents(SCHEDULES=broken)),
        pytest.raises(ImproperlyConfigured, match="has 4 field"),
    ):
        enqueue_due(now=at(1))
    assert Intent.objects.count() == 0


@every_minute()
def test_a_naive_now_is_refused_and_writes_nothing():
    with pytest.raises(ValueError, match="aware"):
        enqueue_due(now=datetime(2026, 1, 1, 12))  # noqa: DTZ001
    assert Intent.objects.count() == 0


@every_minute()
def test_now_defaults_to_the_current_time():
    before = timezone.now()
    [id] = enqueue_due()
    assert before - timedelta(minutes=1) < Intent.objects.get(pk=id).next_at <= timezone.now()


# -- the pool's tick -------------------------------------------------------------------------


def test_a_pool_without_schedules_of_its_kinds_never_queries_nor_wakes_for_them(
    django_assert_num_queries,
):
    tick = ScheduleTick(["job"], "default")
    with override_settings(INTENTS=intents(SCHEDULES={"p": {**HOURLY, "kind": "push"}})):
        with django_assert_num_queries(0):
            tick.run_due(0.0)
        assert tick.wake_at() == math.inf
    assert Intent.objects.count() == 0


@every_minute()
def test_a_pool_ticks_at_most_once_a_second(django_assert_num_queries):
    tick = ScheduleTick(["job"], "default")
    tick.run_due(100.0)  # enqueues the slot due now
    with django_assert_num_queries(0):
        tick.run_due(100.9)
    assert tick.wake_at() == 101.0
    with django_assert_num_queries(1):
        tick.run_due(101.0)
    assert Intent.objects.count() == 1


@every_minute()
def test_a_failing_tick_warns_once_keeps_the_pool_going_and_says_when_it_works_again(
    monkeypatch, caplog
):
    tick, calls = ScheduleTick(["job"], "default"), []

    def broken(**kwargs: Any) -> list[str]:
        calls.append(kwargs)
        raise DatabaseError("server closed the connection")

    monkeypatch.setattr(housekeeping, "enqueue_due", broken)
    with caplog.at_level(logging.INFO, logger="django_intents.worker"):
        tick.run_due(1.0)
        tick.run_due(2.0)
        monkeypatch.undo()
        tick.run_due(3.0)
    assert calls == [{"kinds": ["job"], "using": "default"}] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "enqueuing due schedule slots failed: DatabaseError: server closed the connection",
        "enqueuing due schedule slots works again",
    ]
    assert Intent.objects.count() == 1  # the tick that worked enqueued the due slot
