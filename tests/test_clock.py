"""The manager's clock is the database's (SPEC §12), read rarely and carried forward."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_intents.models import Intent
from django_intents.store import clock, read_clock

pytestmark = pytest.mark.django_db
LONG_AGO = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_readings():
    clock.forget()
    yield
    clock.forget()


def pinned(at: datetime) -> None:
    """Make the process's reading of the database's clock ``at``, as of now."""
    clock._readings[connection.alias] = clock.Reading(at, time.monotonic())


def test_server_now_agrees_with_the_database_read_directly():
    direct = read_clock(connection) or clock.wall_clock()
    assert abs((clock.server_now() - direct).total_seconds()) < 1


def test_server_now_ignores_this_processs_wall_clock_as_python_sees_it(monkeypatch):
    real = clock.server_now()
    monkeypatch.setattr(time, "time", lambda: 0.0)
    monkeypatch.setattr(timezone, "now", lambda: LONG_AGO)
    assert abs((clock.server_now() - real).total_seconds()) < 1


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's clock is never carried")
def test_a_reading_is_carried_forward_without_a_query_until_it_is_stale(
    monkeypatch, django_assert_num_queries
):
    with django_assert_num_queries(1):
        first = clock.server_now()
    with django_assert_num_queries(0):
        later = clock.server_now()
    assert first <= later
    monkeypatch.setattr(clock, "REFRESH", 0.0)
    with django_assert_num_queries(0):
        clock.server_now(read=False)  # a recorder's thread: the old reading
    with django_assert_num_queries(1):
        clock.server_now()


def test_the_manager_writes_and_compares_by_the_databases_clock():
    pinned(LONG_AGO)
    id = Intent.objects.enqueue("webhook", "clocked", "https://example.com/hook")
    intent = Intent.objects.get(id=id)
    assert abs((intent.created_at - LONG_AGO).total_seconds()) < 5
    assert abs((intent.next_at - LONG_AGO).total_seconds()) < 5

    [claimed] = Intent.objects.claim_many(1, lease=30)
    assert claimed.claim_until is not None
    assert abs((claimed.claim_until - LONG_AGO - timedelta(seconds=30)).total_seconds()) < 5
    # By the database's clock the lease holds, though it ended long ago by this host's.
    assert not Intent.objects.expired().exists()
    pinned(LONG_AGO + timedelta(seconds=31))
    assert list(Intent.objects.expired().values_list("id", flat=True)) == [id]


def test_now_given_still_wins():
    pinned(LONG_AGO)
    at = datetime(2030, 1, 1, tzinfo=UTC)
    id = Intent.objects.enqueue("webhook", "given", "https://example.com/hook", now=at)
    assert Intent.objects.get(id=id).created_at == at


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's clock is never carried")
def test_a_reading_held_up_on_its_way_back_is_taken_again(monkeypatch):
    answers = []

    def slow_then_quick(conn):
        answers.append(read_clock(conn))
        if len(answers) == 1:
            time.sleep(0.5)  # held up between the server's answer and the stamp
        return answers[-1]

    monkeypatch.setattr(clock, "read_clock", slow_then_quick)
    clock.refresh(connection.alias)
    assert len(answers) == 2
    lag = (read_clock(connection) - clock.server_now()).total_seconds()
    assert lag < 0.25, lag
