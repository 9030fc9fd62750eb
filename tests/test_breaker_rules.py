"""The breaker's arithmetic and a target's transitions (``rules/targets``), driven by ``now``.

Pure functions: no database. A random run of events is replayed against a
model written from SPEC §14's words, and every step must agree with it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_intents.rules.targets import (
    Breaker,
    Event,
    Health,
    TargetHealth,
    after,
    reaped,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.django_db(databases=[])

breakers = st.builds(
    Breaker,
    failures=st.integers(1, 6),
    cooldown=st.floats(0.5, 100, allow_nan=False),
    max_cooldown=st.just(1e9),
).map(lambda b: Breaker(b.failures, b.cooldown, max(b.cooldown, b.cooldown * 8)))


@given(breakers, st.integers(1, 80))
def test_the_cooldown_doubles_per_opening_up_to_the_maximum(breaker, openings):
    cooldown = breaker.cooldown_for(openings)
    assert cooldown == min(breaker.cooldown * 2 ** (openings - 1), breaker.max_cooldown)
    assert breaker.cooldown <= cooldown <= breaker.max_cooldown
    assert breaker.cooldown_for(openings + 1) >= cooldown


@given(breakers, st.lists(st.sampled_from(["ok", "fail"]), max_size=30))
def test_the_breaker_opens_after_f_consecutive_failures_and_success_resets(breaker, results):
    health: Health | None = None
    run = 0
    now = T0
    for step, result in enumerate(results):
        now = T0 + timedelta(seconds=step)
        if health is not None and health.state == TargetHealth.OPEN:
            break  # what happens while open has tests of its own
        event = Event.SUCCESS if result == "ok" else Event.FAILURE
        health = after(health, event, now=now, breaker=breaker, error="boom")
        run = 0 if result == "ok" else run + 1
        if run == 0:
            assert health is None  # a success leaves no row
        elif run < breaker.failures:
            assert health == Health(TargetHealth.CLOSED, run, 0, None, "boom")
        else:
            assert health is not None and health.state == TargetHealth.OPEN
            assert health.openings == 1
            assert health.until == now + timedelta(seconds=breaker.cooldown)
            assert health.blocks(now) and health.blocks(health.until + timedelta(days=1))


@settings(max_examples=60)
@given(breakers, st.lists(st.booleans(), min_size=1, max_size=12))
def test_each_failed_probe_reopens_with_the_next_cooldown_and_a_success_closes(breaker, probes):
    health = Health(TargetHealth.OPEN, breaker.failures, 1, T0, "boom")
    now = T0
    for n, succeeds in enumerate(probes):
        # The cooldown is over: half-open, and a probe is taken.
        assert health.until is not None and now >= health.until
        half = Health(TargetHealth.HALF_OPEN, health.failures, health.openings, None, "", "")
        assert half.blocks(now) and not half.blocks(now, exempt=True)
        probing = Health(TargetHealth.HALF_OPEN, half.failures, half.openings, None, "", f"p{n}")
        assert probing.blocks(now, exempt=True)
        now += timedelta(seconds=1)
        event = Event.SUCCESS if succeeds else Event.FAILURE
        result = after(probing, event, now=now, breaker=breaker, intent=f"p{n}")
        if succeeds:
            assert result is None
            return
        assert result is not None and result.state == TargetHealth.OPEN
        assert result.openings == health.openings + 1
        assert result.until == now + timedelta(seconds=breaker.cooldown_for(result.openings))
        health, now = result, result.until


@given(breakers, st.integers(0, 5))
def test_a_failure_of_an_attempt_older_than_the_probe_only_counts(breaker, failures):
    probing = Health(TargetHealth.HALF_OPEN, failures, 2, None, "", "probe")
    result = after(probing, Event.FAILURE, now=T0, breaker=breaker, intent="older")
    assert result == Health(TargetHealth.HALF_OPEN, failures + 1, 2, None, "", "probe")


@given(
    st.floats(0, 1000, allow_nan=False),
    st.floats(0, 1000, allow_nan=False),
    st.floats(0, 2000, allow_nan=False),
)
def test_a_hold_blocks_until_the_latest_end_asked(first, second, probe_at):
    a, b = T0 + timedelta(seconds=first), T0 + timedelta(seconds=second)
    held = after(None, Event.HOLD, now=T0, breaker=None, until=a)
    held = after(held, Event.HOLD, now=T0, breaker=None, until=b)
    assert held is not None and held.state == TargetHealth.HELD and held.until == max(a, b)
    at = T0 + timedelta(seconds=probe_at)
    assert held.blocks(at) == (at < max(a, b))
    # A success during a hold keeps it: the partner asked for the wait.
    assert after(held, Event.SUCCESS, now=T0, breaker=None) == held


def test_neither_a_snooze_nor_a_stop_counts_and_a_probe_without_a_verdict_is_probed_again():
    breaker = Breaker(2, 10, 100)
    counted = Health(TargetHealth.CLOSED, 1, 0, None, "boom")
    assert after(counted, Event.NEUTRAL, now=T0, breaker=breaker) == counted
    probing = Health(TargetHealth.HALF_OPEN, 2, 1, None, "boom", "p")
    again = after(probing, Event.NEUTRAL, now=T0, breaker=breaker, intent="p")
    assert again == Health(TargetHealth.HALF_OPEN, 2, 1, None, "boom", "")


def test_a_probe_whose_lease_expired_failed_and_one_completed_inside_its_handler_succeeded():
    breaker = Breaker(2, 10, 100)
    probing = Health(TargetHealth.HALF_OPEN, 2, 1, None, "", "p")
    assert reaped(probing, "running", False, now=T0, breaker=breaker) == probing
    expired = reaped(probing, "running", True, now=T0, breaker=breaker)
    assert expired is not None and expired.state == TargetHealth.OPEN and expired.openings == 2
    assert expired.until == T0 + timedelta(seconds=20)
    assert reaped(probing, "completed", False, now=T0, breaker=breaker) is None
    moved = reaped(probing, "cancelled", False, now=T0, breaker=breaker)
    assert moved is not None and (moved.state, moved.probe) == (TargetHealth.HALF_OPEN, "")
