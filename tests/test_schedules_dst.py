"""Schedules in a zone that changes clocks: once per local slot across the change.

Europe/Paris goes from 02:00 CET to 03:00 CEST on 29 March 2026 and from
03:00 CEST back to 02:00 CET on 25 October 2026. A pool is simulated ticking
every 50 s (so every slot is seen while it is due) with ``catch_up="none"``,
so what is enqueued is what fired, not what catch-up filled in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_intents.models import Intent
from django_intents.rules.cron import Schedule
from django_intents.schedules import enqueue_due

from .conftest import intents

pytestmark = pytest.mark.django_db

PARIS = ZoneInfo("Europe/Paris")
TICK = timedelta(seconds=50)


def fired(cron: str, start: datetime, end: datetime) -> list[datetime]:
    """Tick a pool from ``start`` to ``end``; the slots enqueued, as Paris wall-clock times."""
    entry = {"cron": cron, "kind": "job", "target": "t", "tz": "Europe/Paris", "catch_up": "none"}
    with override_settings(INTENTS=intents(SCHEDULES={"paris": entry})):
        now = start
        while now < end:
            enqueue_due(now=now)
            now += TICK
    next_ats = Intent.objects.order_by("next_at").values_list("next_at", flat=True)
    assert Intent.objects.count() == len(set(next_ats))  # one intent per slot
    return [next_at.astimezone(PARIS) for next_at in next_ats]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def wall(moments: list[datetime]) -> list[str]:
    return [moment.strftime("%m-%d %H:%M %Z") for moment in moments]


def around(day: datetime) -> tuple[datetime, datetime]:
    """23:30 UTC the evening before ``day`` to 03:00 UTC: 00:30 to 04:00 or 05:00 local."""
    return day - timedelta(minutes=30), day + timedelta(hours=3)


def test_a_daily_slot_in_the_skipped_hour_fires_once_at_the_end_of_the_gap():
    assert wall(fired("30 2 * * *", *around(utc(2026, 3, 29)))) == ["03-29 03:00 CEST"]


def test_a_daily_slot_in_the_repeated_hour_fires_once_in_its_first_pass():
    assert wall(fired("30 2 * * *", *around(utc(2026, 10, 25)))) == ["10-25 02:30 CEST"]


def test_a_daily_slot_fires_once_per_local_day_across_both_changes():
    days = [utc(2026, 3, day) for day in (27, 28, 29, 30)] + [
        utc(2026, 10, day) for day in (23, 24, 25, 26)
    ]
    for day in days:  # only the hours around the slot: keeps the test fast
        slots = fired("30 2 * * *", day, day + timedelta(hours=1, minutes=50))
    assert wall(slots) == [
        "03-27 02:30 CET", "03-28 02:30 CET", "03-29 03:00 CEST", "03-30 02:30 CEST",
        "10-23 02:30 CEST", "10-24 02:30 CEST", "10-25 02:30 CEST", "10-26 02:30 CET",
    ]  # fmt: skip


def test_an_every_quarter_hour_schedule_keeps_its_pace_through_the_skipped_hour():
    assert wall(fired("*/15 * * * *", utc(2026, 3, 29, 0, 40), utc(2026, 3, 29, 1, 20))) == [
        "03-29 01:45 CET", "03-29 03:00 CEST", "03-29 03:15 CEST",
    ]  # fmt: skip


def test_an_every_quarter_hour_schedule_fires_in_both_passes_of_the_repeated_hour():
    slots = wall(fired("*/15 * * * *", utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 1, 59)))
    assert slots == [
        "10-25 02:00 CEST", "10-25 02:15 CEST", "10-25 02:30 CEST", "10-25 02:45 CEST",
        "10-25 02:00 CET", "10-25 02:15 CET", "10-25 02:30 CET", "10-25 02:45 CET",
    ]  # fmt: skip


@pytest.mark.parametrize("cron", ["30 2 * * *", "0,30 1-3 * * *", "*/20 * * * *", "0 * * * 0"])
@pytest.mark.parametrize("day", [utc(2026, 3, 29), utc(2026, 10, 25), utc(2026, 11, 1)])
@pytest.mark.parametrize("tz", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe"])
def test_looking_back_agrees_with_stepping_forward_across_a_change(cron, day, tz):
    """``latest`` and ``before`` (which start from cronsim's reverse iteration) name the
    same slots as stepping forward, and slots only ever increase."""
    schedule = Schedule(name="s", cron=cron, kind="job", target="t", tz=tz)
    forward, moment = [], day - timedelta(days=8)
    while (moment := schedule.after(moment)) is not None and moment < day + timedelta(days=1):
        forward.append(moment)
    assert forward == sorted(set(forward))
    probe = day - timedelta(hours=2)
    while probe < day + timedelta(hours=12):
        assert schedule.latest(probe) == max(s for s in forward if s <= probe), probe
        probe += timedelta(minutes=7, seconds=11)
    for index in range(5, len(forward)):
        assert schedule.before(forward[index], 5) == tuple(forward[index - 5 : index])
