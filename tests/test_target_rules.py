"""The arithmetic of target health (``rules/targets.py``, SPEC §14), driven by ``now``.

No clock and no database: a rate's window is a function of the start times
and ``now``. Hypothesis checks the window against its definition ("in any
window of K seconds at most N start"), and that admitting by ``room`` and
waiting for ``next_start`` never breaks it. The settings' errors name the
key that is wrong, through ``get_settings`` and the system check.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_intents.conf import get_settings
from django_intents.rules.limits import Admission, Limit, Started, rates_of
from django_intents.rules.targets import (
    Breaker,
    Event,
    Health,
    Rate,
    TargetHealth,
    TargetPolicy,
    after,
    learned_pace,
    pace_window,
    paced_until,
    parse_rate,
)

from .conftest import intents

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def fullest(starts: list[float], seconds: float) -> int:
    """The definition: the most starts inside one window ``(t - seconds, t]``."""
    ordered = sorted(starts)
    return max((sum(1 for s in ordered if end - seconds < s <= end) for end in ordered), default=0)


# -- the window ----------------------------------------------------------------------


def test_room_counts_the_starts_after_now_minus_the_window():
    rate = Rate(3, 10.0)
    assert rate.room([], 100.0) == 3
    assert rate.room([91.0, 95.0], 100.0) == 1
    assert rate.room([90.0, 95.0], 100.0) == 2  # a start exactly a window ago has left it
    assert rate.room([91.0, 95.0, 99.0, 100.0], 100.0) == 0  # never below zero


def test_a_margin_counts_each_start_longer_than_its_window():
    """The margin parse_rate gives a configured rate: the claim is counted a moment
    before the partner sees the request, by an amount that varies."""
    rate = Rate(2, 1.0, 0.1)
    assert rate.room([99.05, 99.5], 100.0) == 0  # 99.05 is still counted at 100.0
    assert rate.room([99.05, 99.5], 100.15) == 1
    assert rate.next_start([99.05, 99.5], 100.0) == pytest.approx(100.15)
    assert rate.window.total_seconds() == pytest.approx(1.1)


def test_a_start_later_than_now_counts_as_one_inside_the_window():
    # Another pool read the clock after this one but claimed first.
    assert Rate(2, 10.0).room([100.5, 101.0], 100.0) == 0


def test_next_start_is_now_with_room_else_when_the_window_slides_past_the_start_that_fills_it():
    rate = Rate(2, 10.0)
    assert rate.next_start([95.0], 100.0) == 100.0
    assert rate.next_start([92.0, 97.0], 100.0) == 102.0
    assert rate.next_start([92.0, 97.0, 99.0], 100.0) == 107.0  # one over (a smaller rate since)


@given(
    count=st.integers(1, 5),
    seconds=st.integers(1, 20),
    arrivals=st.lists(st.integers(0, 2000), max_size=60),
)
def test_admitting_by_room_keeps_every_window_within_the_rate(count, seconds, arrivals):
    """Claims at ``arrivals`` (tenths of a second) take what ``room`` allows, one at a time."""
    rate = Rate(count, float(seconds))
    starts: list[float] = []
    for tenth in sorted(arrivals):
        now = tenth / 10
        if rate.room(starts, now) > 0:
            starts.append(now)
    assert fullest(starts, rate.seconds) <= count


@given(
    count=st.integers(1, 5),
    seconds=st.integers(1, 20),
    starts=st.lists(st.integers(0, 500), max_size=30),
    now=st.integers(0, 600),
)
def test_next_start_is_the_first_moment_with_room(count, seconds, starts, now):
    # Whole seconds: the arithmetic is exact, as it is on the database's microseconds.
    rate = Rate(count, float(seconds))
    past = [float(s) for s in starts if s <= now]
    at = rate.next_start(past, float(now))
    assert at >= now
    assert rate.room(past, at) >= 1
    if at > now:  # nothing earlier had room: just before it, the window is still full
        assert rate.room(past, at - 0.001) == 0


@given(
    count=st.integers(1, 4),
    seconds=st.integers(1, 10),
    demand=st.lists(st.integers(1, 6), min_size=1, max_size=20),
)
def test_a_pool_that_waits_for_next_start_runs_at_the_rate_and_never_above(count, seconds, demand):
    """A queue that wakes at ``next_start`` and starts all ``room`` allows."""
    rate = Rate(count, float(seconds))
    waiting, starts, now = sum(demand), [], 0.0
    while waiting:
        take = min(rate.room(starts, now), waiting)
        starts += [now] * take
        waiting -= take
        now = rate.next_start(starts, now) if waiting else now
    assert fullest(starts, rate.seconds) <= count
    # Full windows back to back: the last start comes as early as the rate allows.
    assert starts[-1] == (len(starts) - 1) // count * rate.seconds


# -- the admission (rules/limits.py) with rates --------------------------------------


def test_admission_gives_each_rated_target_what_its_window_leaves():
    rates = {"k": Rate(2, 10.0)}
    started = {("k", "a"): Started(1, T0), ("k", "b"): Started(2, T0 + timedelta(seconds=3))}
    admission = Admission({}, {}, rates=rates, started=started, now=T0 + timedelta(seconds=5))
    assert admission.full() == ([], [("k", "b")])
    assert [admission.fits("k", t) for t in ("a", "a", "b", "c", "c", "c")] == [
        True,
        False,
        False,
        True,
        True,
        False,
    ]
    assert admission.reopens() == T0 + timedelta(seconds=10)  # a's start at T0 leaves first
    assert admission.fits("other", "a")  # an unrated kind is not counted


def test_admission_applies_caps_and_rate_together_and_counts_a_start_only_when_both_fit():
    rates = {"k": Rate(3, 10.0)}
    admission = Admission({"k": Limit(per_target=1)}, {("k", "a"): 1}, rates=rates, now=T0)
    assert not admission.fits("k", "a")  # per_target refuses: no start is counted
    assert admission.fits("k", "b")  # b now runs its one: full too
    assert admission.full() == ([], [("k", "a"), ("k", "b")])
    assert admission.reopens() is None  # no rated target is spent


def test_admission_under_rates_needs_the_claims_now():
    with pytest.raises(ValueError, match="needs the claim's now"):
        Admission({}, {}, rates={"k": Rate(1, 1.0)})


def test_admission_paces_one_target_of_a_kind_and_leaves_its_others_free():
    paces = {("k", "a"): Rate(2, 1.0, 0.1)}
    started = {("k", "a"): Started(1, T0)}
    admission = Admission({}, {}, started=started, now=T0, paces=paces)
    assert [admission.fits("k", t) for t in ("a", "a", "b", "b", "b")] == [
        True,
        False,
        True,
        True,
        True,
    ]
    assert admission.full() == ([], [("k", "a")])
    assert admission.reopens() == T0 + timedelta(seconds=1.1)


def test_a_paced_target_counts_against_what_a_claim_may_start_at_once():
    paces = {("k", "a"): Rate(5, 1.0)}
    admission = Admission({}, {}, now=T0, paces=paces, paced=1)
    assert admission.fits("k", "a")
    assert not admission.fits("k", "a")  # the claim's one paced start is spent
    assert admission.fits("k", "b")  # an unpaced target of the kind is not counted
    assert admission.full() == ([], [("k", "a")])


# -- the pace a hold teaches (rules/targets.py) -------------------------------------


def test_a_hold_teaches_a_pace_of_its_windows_successes_with_the_rates_margin():
    pace = learned_pace(20, T0, T0 + timedelta(seconds=1.004))
    assert pace == Rate(20, 1.0, 0.1)
    assert learned_pace(100, T0, T0 + timedelta(seconds=20)) == Rate(100, 20.0, 1.0)


def test_a_hold_after_which_nothing_succeeded_teaches_no_pace():
    assert learned_pace(0, T0, T0 + timedelta(seconds=20)) is None


@pytest.mark.parametrize(
    ("held", "window", "memory"),
    [
        (0.2, 1.0, 60.0),
        (1.0, 1.0, 60.0),
        (1.4, 1.0, 60.0),
        (20.0, 20.0, 200.0),
        (1e6, 3600.0, 36000.0),
    ],
)
def test_a_paces_window_is_the_holds_length_in_seconds_and_it_lasts_ten_windows(
    held, window, memory
):
    until = T0 + timedelta(seconds=held)
    assert pace_window(T0, until) == window
    assert paced_until(T0, until) == until + timedelta(seconds=memory)


def test_the_first_429_begins_the_pace_window_and_those_after_it_only_lengthen_the_hold():
    first = after(None, Event.HOLD, now=T0, breaker=None, until=T0 + timedelta(seconds=1))
    assert (first.state, first.held_at) == (TargetHealth.HELD, T0)
    later = T0 + timedelta(seconds=0.5)
    second = after(first, Event.HOLD, now=later, breaker=None, until=later + timedelta(seconds=1))
    assert second.held_at == T0 and second.until == later + timedelta(seconds=1)
    assert second.paced_until == second.until + timedelta(seconds=60)
    anew = T0 + timedelta(seconds=30)  # the hold was over: a new one begins
    third = after(second, Event.HOLD, now=anew, breaker=None, until=anew + timedelta(seconds=1))
    assert third.held_at == anew


def test_a_429_to_a_breakers_open_target_lengthens_it_and_teaches_no_pace():
    opened = Health(TargetHealth.OPEN, 5, 1, T0 + timedelta(seconds=10))
    held = after(opened, Event.HOLD, now=T0, breaker=Breaker(5), until=T0 + timedelta(seconds=30))
    assert held == Health(TargetHealth.OPEN, 5, 1, T0 + timedelta(seconds=30))


def test_a_success_keeps_a_closed_targets_pace_and_a_breakers_opening_drops_it():
    held = after(None, Event.HOLD, now=T0, breaker=None, until=T0 + timedelta(seconds=1))
    closed = Health(until=held.until, held_at=held.held_at, paced_until=held.paced_until)
    assert not closed.plain
    ok = after(closed, Event.SUCCESS, now=T0 + timedelta(seconds=2), breaker=None)
    assert ok == closed
    breaker = Breaker(1, 10.0)
    opened = after(closed, Event.FAILURE, now=T0 + timedelta(seconds=3), breaker=breaker)
    assert opened.state == TargetHealth.OPEN and opened.paced_until is None
    over = closed.unpaced(held.paced_until)
    assert over.plain and over.until is None


# -- the setting -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5/s", Rate(5, 1.0, 0.1)),  # each start counts a tenth longer, at most a second
        ("100/20s", Rate(100, 20.0, 1.0)),
        (" 3 / m ", Rate(3, 60.0, 1.0)),
        ("10/2h", Rate(10, 7200.0, 1.0)),
    ],
)
def test_a_rate_parses_into_attempts_per_window(value, expected):
    assert parse_rate("k", value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("5", "must be 'N/s', 'N/m', 'N/h' or 'N/Ks'"),
        ("5/d", "must be 'N/s'"),
        ("-1/s", "must be 'N/s'"),
        ("1.5/s", "must be 'N/s'"),
        (5, "not 5"),
        ("0/s", "at least 1 attempt per a positive window"),
        ("3/0s", "at least 1 attempt per a positive window"),
    ],
)
def test_a_bad_rate_is_an_improperly_configured_naming_the_key(value, message):
    with (
        override_settings(INTENTS=intents(LIMITS={"k": {"rate": value}})),
        pytest.raises(ImproperlyConfigured) as caught,
    ):
        get_settings()
    assert "INTENTS['LIMITS']" in str(caught.value)
    assert "['k']['rate']" in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"failures": 0}, "['breaker']['failures']"),
        ({"failures": 3, "cooldown": -1}, "['breaker']['cooldown']"),
        ({"failures": 3, "cooldown": 60, "max_cooldown": 30}, "['breaker']['cooldown']"),
        ({"failures": 3, "colldown": 5}, "unknown key(s) colldown"),
        ([3], "['breaker'] must be a dict"),
    ],
)
def test_a_bad_breaker_is_an_improperly_configured_naming_the_key(value, key):
    with (
        override_settings(INTENTS=intents(LIMITS={"k": {"breaker": value}})),
        pytest.raises(ImproperlyConfigured, match=r"INTENTS\['LIMITS'\]") as caught,
    ):
        get_settings()
    assert key in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"rate": "fast"}, r"\['k'\]\['rate'\]"),
        ({"ordered": "yes"}, r"\['k'\]\['ordered'\]"),
        ({"breaker": {"failures": True}}, r"\['k'\]\['breaker'\]\['failures'\]"),
        ({"rate": "1/s", "raet": "2/s"}, r"unknown key\(s\) raet"),
    ],
)
def test_a_bad_policy_fails_the_system_check_naming_the_key(entry, key):
    with (
        override_settings(INTENTS=intents(LIMITS={"k": entry})),
        pytest.raises(SystemCheckError, match=r"INTENTS\['LIMITS'\].*" + key),
    ):
        call_command("check")


def test_a_kind_with_only_a_rate_has_no_caps_and_its_rate_reaches_the_claims():
    with override_settings(INTENTS=intents(LIMITS={"k": {"rate": "2/s"}, "c": {"running": 1}})):
        built = get_settings()
    assert built.limits == {"c": Limit(running=1)}
    assert built.targets == {"k": TargetPolicy(rate=Rate(2, 1.0, 0.1))}
    assert rates_of(built.targets) == {"k": Rate(2, 1.0, 0.1)}
