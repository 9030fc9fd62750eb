"""Held targets and the circuit breaker in the claims (SPEC §14), time driven by ``now=``.

The rows of ``TargetState`` are written by the results a pool records
(``Intent.objects.record_target_events``, what the recorder calls) and read
by every claim: a held or open target's intents stay pending, untouched, in
their place, while the other targets' flow. Worker processes are in
``test_target_health_process.py``; the arithmetic alone in
``test_target_rules.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.dispatch import receiver
from django.test import override_settings
from django.utils import timezone

from django_intents import Retry
from django_intents.attempt import Attempt
from django_intents.models import Intent, TargetStart, TargetState
from django_intents.rules.targets import Event, target_key
from django_intents.signals import Outcome, target_state_changed
from django_intents.store import backend_for
from django_intents.store.endings import Ending
from django_intents.store.memory import ClaimMemory
from django_intents.store.table import Table
from django_intents.store.targets import TargetEvent
from django_intents.worker.execution import Claim
from django_intents.worker.recorder import Recorder

from .conftest import at, external_kinds, intents

pytestmark = pytest.mark.django_db(transaction=True)

HOOK, FREE = "h.hook", "h.free"
EVENTS = itertools.count()
BREAKER = {"failures": 3, "cooldown": 10, "max_cooldown": 25}


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(HOOK, FREE):
        yield


def settings(**hook: Any) -> Any:
    """``INTENTS`` with ``LIMITS[HOOK]`` (a breaker by default)."""
    declared = [*intents().get("EXTERNAL_KINDS", ()), HOOK, FREE]
    entry = hook or {"breaker": BREAKER}
    return override_settings(INTENTS=intents(EXTERNAL_KINDS=declared, LIMITS={HOOK: entry}))


def enqueue(targets: list[str], kind: str = HOOK, start: float = 0.0, **kw: Any) -> list[str]:
    """One intent per entry of ``targets``, due one second apart, in that order."""
    return [
        Intent.objects.enqueue(kind, f"{kind}-{start + i}", target, now=at(start + i), **kw)
        for i, target in enumerate(targets)
    ]


def event(target: str, what: Event, kind: str = HOOK, **kw: Any) -> TargetEvent:
    return TargetEvent(kind, target, what, **kw)


def row(target: str, kind: str = HOOK) -> TargetState | None:
    return TargetState.objects.filter(key=target_key(kind, target)).first()


def claimed_targets(now: float, limit: int = 50, **kw: Any) -> list[str]:
    return [i.target for i in Intent.objects.claim_many(limit, now=at(now), lease=100, **kw)]


def untouched(ids: list[str]) -> list[tuple[str, int]]:
    rows = Intent.objects.filter(id__in=ids).order_by("created_at")
    return [(r.state, r.attempts) for r in rows]


@pytest.fixture
def changes() -> Iterator[list[tuple[str, str, str, str]]]:
    seen: list[tuple[str, str, str, str]] = []

    @receiver(target_state_changed, sender=Intent, weak=False)
    def note(sender: Any, kind: str, target: str, state: str, previous: str, **kw: Any) -> None:
        seen.append((kind, target, state, previous))

    yield seen
    target_state_changed.disconnect(note, sender=Intent)


# -- holds ------------------------------------------------------------------------


def test_a_hold_stops_the_claims_of_its_target_only_until_it_ends(changes):
    held = enqueue(["a", "b", "a", "c"])
    hold = event("a", Event.HOLD, until=at(60))
    Intent.objects.record_target_events([hold], now=at(5))
    assert row("a").state == "held" and row("a").until == at(60)
    assert claimed_targets(10) == ["b", "c"]
    assert untouched([held[0], held[2]]) == [("pending", 0), ("pending", 0)]
    assert claimed_targets(59.9) == []
    assert claimed_targets(60.1) == ["a", "a"]
    assert changes == [(HOOK, "a", "held", "closed")]


def test_a_hold_holds_on_every_claim_path(vendor):
    enqueue(["a", "b"])
    enqueue(["a", "b"], kind=FREE, start=10)
    ids = enqueue(["a", "b"], start=20, priority=5)
    Intent.objects.record_target_events([event("a", Event.HOLD, until=at(100))], now=at(0))
    assert Intent.objects.has_due(now=at(30), kinds=[HOOK], since=at(0))
    one = Intent.objects.claim(now=at(30), kinds=[HOOK])
    assert (one.id, one.target) == (ids[1], "b")  # the high priority branch, past "a"
    with settings(running=10, per_target=5):  # the limited claim
        assert claimed_targets(30, kinds=[HOOK]) == ["b"]
        assert claimed_targets(30, kinds=[FREE], since=at(0)) == ["a", "b"]  # held is per kind
    assert not Intent.objects.has_due(now=at(30), kinds=[HOOK])
    assert Intent.objects.filter(kind=HOOK, target="a", state="pending", attempts=0).count() == 2


def test_a_later_hold_is_kept_and_an_earlier_one_does_not_shorten_it():
    Intent.objects.record_target_events([event("a", Event.HOLD, until=at(60))], now=at(0))
    Intent.objects.record_target_events([event("a", Event.HOLD, until=at(30))], now=at(1))
    assert row("a").until == at(60)
    Intent.objects.record_target_events([event("a", Event.HOLD, until=at(90))], now=at(2))
    assert row("a").until == at(90)


def test_ended_holds_are_swept_and_the_table_stays_small(changes):
    Intent.objects.record_target_events(
        [event("a", Event.HOLD, until=at(10)), event("b", Event.HOLD, until=at(100))], now=at(0)
    )
    assert Intent.objects.end_holds(now=at(50)) == 1
    assert row("a") is None and row("b").state == "held"
    assert changes[-1] == (HOOK, "a", "closed", "held")


def test_a_snooze_that_holds_its_target_is_written_with_its_result(vendor):
    [first, second] = enqueue(["a", "a"])
    claim = Intent.objects.claim(now=at(5), lease=30)
    assert claim.id == first
    with pytest.raises(TypeError, match="hold_target"):
        Retry(after=5, hold_target="yes")
    with pytest.raises(ValueError, match="needs after"):
        Retry(hold_target=True)
    retry = Retry(after=20, reason="429", hold_target=True)
    due = retry.due(at(6))
    Intent.objects.finish_many(
        [Ending(first, claim.claim_token, "pending", next_at=due, error="429", snooze=True)],
        now=at(6),
    )
    Intent.objects.record_target_events(
        [event("a", Event.HOLD, intent=first, until=due)], now=at(6)
    )
    assert claimed_targets(10) == []
    assert Intent.objects.get(id=second).attempts == 0
    assert [i.id for i in Intent.objects.claim_many(5, now=at(26.5))] == [second, first]


# -- the pace a hold teaches (rules.targets.learned_pace) -------------------------


def taught(now: float = 0.0) -> list[str]:
    """Twelve intents of "a" and three of "b", all due; five of "a" claimed at ``now``,
    three completed, then a 429 holds "a" for 1 s, then the fifth completes (it was
    on its way): the partner took four around the hold."""
    ids = enqueue(["a"] * 12 + ["b"] * 3, start=now - 50)
    first = Intent.objects.claim_many(5, now=at(now), lease=100, kinds=[HOOK])
    assert [i.target for i in first] == ["a"] * 5
    for claim in first[:3]:
        assert Intent.objects.complete(claim.id, claim.claim_token, now=at(now + 0.2))
    hold = event("a", Event.HOLD, intent=first[3].id, until=at(now + 1.3))
    Intent.objects.record_target_events([hold], now=at(now + 0.3))
    assert Intent.objects.complete(first[4].id, first[4].claim_token, now=at(now + 0.5))
    return ids


def test_after_a_hold_its_target_starts_only_as_fast_as_its_partner_took_around_it(vendor):
    ids = taught()
    assert claimed_targets(1.0) == ["b"] * 3  # held: "a" waits
    assert claimed_targets(1.4) == ["a"] * 4  # the pace: four a second
    assert claimed_targets(2.0) == []
    assert claimed_targets(2.6) == ["a"] * 3  # 1.4 + 1 s + its margin; then none is left
    assert Intent.objects.filter(id__in=ids, state="pending").count() == 0
    assert Intent.objects.filter(id__in=ids, attempts__gt=1).count() == 0


def test_a_pace_counts_only_the_successes_of_its_own_target(vendor):
    # "A" is another target, whatever the collation of the target column.
    others = enqueue(["A"] * 3, start=-80)
    for claim in Intent.objects.claim_many(3, now=at(-1), lease=100, kinds=[HOOK]):
        assert claim.id in others
        assert Intent.objects.complete(claim.id, claim.claim_token, now=at(0.1))
    taught()
    assert claimed_targets(1.4) == ["a"] * 4 + ["b"] * 3


def test_two_pools_share_one_learned_pace(vendor):
    taught()
    first, second = ClaimMemory(), ClaimMemory()
    one = Intent.objects.claim_many(2, now=at(1.4), lease=100, kinds=[HOOK], memory=first)
    two = Intent.objects.claim_many(50, now=at(1.45), lease=100, kinds=[HOOK], memory=second)
    assert [i.target for i in one] == ["a", "a"]
    assert [i.target for i in two] == ["a", "a", "b", "b", "b"]  # the pace's other two
    assert Intent.objects.filter(kind=HOOK, target="a", state="pending").count() == 3


def test_a_learned_pace_is_kept_in_a_closed_row_and_swept_when_it_is_over(vendor, changes):
    taught()
    assert Intent.objects.end_holds(now=at(5)) == 1
    state = row("a")
    assert (state.state, state.held_at, state.paced_until) == ("closed", at(0.3), at(61.3))
    assert Intent.objects.targets(kind=HOOK) == []  # healthy: not an operator's concern
    assert claimed_targets(5) == ["a"] * 4 + ["b"] * 3
    assert Intent.objects.end_holds(now=at(61.4)) == 0  # no state changed: it was closed
    assert row("a") is None
    assert claimed_targets(62) == ["a"] * 3  # free again: every due one at once
    assert changes == [(HOOK, "a", "held", "closed"), (HOOK, "a", "closed", "held")]


def starts(target: str) -> int:
    return TargetStart.objects.filter(target_key=target_key(HOOK, target)).count()


def test_a_pace_that_is_over_takes_its_targets_starts_with_it(vendor):
    """Only the claims of a paced target prune its starts; after the pace none comes."""
    taught()
    assert claimed_targets(1.4) == ["a"] * 4 + ["b"] * 3
    assert starts("a") == 4 and starts("b") == 0
    assert Intent.objects.end_holds(now=at(5)) == 1  # held to closed: the pace stays
    assert starts("a") == 4
    assert Intent.objects.end_holds(now=at(61.4)) == 0
    assert row("a") is None and starts("a") == 0
    assert TargetStart.objects.count() == 0


def test_a_rated_kind_keeps_its_starts_when_a_pace_ends(vendor):
    taught()
    with settings(rate="100/s"):
        assert claimed_targets(1.4) == ["a"] * 7 + ["b"] * 3  # the kind's own rate counts
        counted = starts("a")
        assert counted == 7
        Intent.objects.end_holds(now=at(5))
        assert Intent.objects.end_holds(now=at(61.4)) == 0
        assert row("a") is None
        assert starts("a") == counted  # the rate's own claims prune them, by its window


def test_a_hold_by_hand_forgets_a_learned_pace(vendor):
    taught()
    assert Intent.objects.open_target(HOOK, "a", 2, now=at(0.4))
    state = row("a")
    assert (state.held_at, state.paced_until) == (None, None)
    assert claimed_targets(3) == ["a"] * 7 + ["b"] * 3


def test_a_rated_kinds_own_rate_wins_over_a_learned_pace(vendor):
    taught()
    with settings(rate="2/s"):
        assert claimed_targets(1.4) == ["a", "a", "b", "b"]


# -- the breaker ------------------------------------------------------------------


def fail(target: str, now: float, count: int = 1, intent: str = "") -> None:
    events = [event(target, Event.FAILURE, intent=intent, error="503") for _ in range(count)]
    Intent.objects.record_target_events(events, now=at(now))


def test_the_breaker_opens_after_f_consecutive_failures_and_a_success_resets_the_count(changes):
    with settings():
        enqueue(["a", "b"])
        fail("a", 0, 2)
        assert (row("a").state, row("a").failures) == ("closed", 2)
        Intent.objects.record_target_events([event("a", Event.SUCCESS)], now=at(1))
        assert row("a") is None
        fail("a", 2, 2)
        fail("a", 3)
        state = row("a")
        assert (state.state, state.failures, state.openings) == ("open", 3, 1)
        assert state.until == at(13)
        assert claimed_targets(5) == ["b"]
    assert changes == [(HOOK, "a", "open", "closed")]


def test_failures_of_a_kind_without_a_breaker_leave_no_row():
    fail("a", 0, 10)
    assert TargetState.objects.count() == 0


def test_after_the_cooldown_exactly_one_intent_is_claimed_as_the_probe(changes):
    with settings():
        ids = enqueue(["a", "a", "a", "b"])
        fail("a", 5, 3)
        assert claimed_targets(10) == ["b"]
        probe = Intent.objects.claim_many(10, now=at(16), lease=5)
        assert [i.id for i in probe] == [ids[0]]
        assert (row("a").state, row("a").probe) == ("half_open", ids[0])
        assert claimed_targets(17) == []  # the probe is out
        assert untouched(ids[1:3]) == [("pending", 0), ("pending", 0)]
        Intent.objects.complete(ids[0], probe[0].claim_token, now=at(18))
        Intent.objects.record_target_events([event("a", Event.SUCCESS, intent=ids[0])], now=at(18))
        assert row("a") is None
        assert claimed_targets(19) == ["a", "a"]
    assert changes == [
        (HOOK, "a", "open", "closed"),
        (HOOK, "a", "half_open", "open"),
        (HOOK, "a", "closed", "half_open"),
    ]


def test_a_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_maximum():
    with settings():
        ids = enqueue(["a"] * 6)
        fail("a", 0, 3)
        now, cooldowns = 0.0, []
        for _ in range(3):  # 10 s, doubled, then the maximum
            until = row("a").until
            now = (until - at(0)).total_seconds() + 0.5
            [probe] = Intent.objects.claim_many(10, now=at(now), lease=5)
            assert probe.id in ids
            fail("a", now + 1, intent=probe.id)
            state = row("a")
            cooldowns.append((state.until - at(now + 1)).total_seconds())
            assert state.state == "open" and state.probe == ""
        assert cooldowns == [20, 25, 25]
        assert row("a").openings == 4


def test_two_pools_in_half_open_claim_one_probe_between_them(vendor):
    with settings():
        ids = enqueue(["a", "a", "a"])
        fail("a", 0, 3)
        first, second = ClaimMemory(), ClaimMemory()
        # The second pool read the half-open target before the first claimed its probe.
        second.probing, second.watch_at = {target_key(HOOK, "a"): (HOOK, "a")}, 1e18
        one = Intent.objects.claim_many(10, now=at(11), lease=5, memory=first)
        two = Intent.objects.claim_many(10, now=at(11), lease=5, memory=second)
        assert len(one) + len(two) == 1
        assert row("a").probe in ids
        rest = [i for i in ids if i != row("a").probe]
        assert untouched(rest) == [("pending", 0), ("pending", 0)]


def test_a_pool_whose_look_raced_the_half_opening_leaves_the_other_pools_probe_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two pools look at the target as its cooldown ends: the first half-opens it and
    claims its probe while the second waits for the row's lock. The second must
    find the probe running, not lost (its look read no probe), or a second
    intent is sent to a partner that is down."""
    with settings():
        ids = enqueue(["a", "a", "a"])
        fail("a", 0, 3)
        first, second = ClaimMemory(), ClaimMemory()
        taken: list[Any] = []
        look = Table.run

        def racing(table: Table, name: str, /, **params: Any) -> list[Any]:
            rows = look(table, name, **params)
            if name == "target_watch" and not taken:  # the second pool's look, then the first
                taken.append(None)
                taken[:] = Intent.objects.claim_many(10, now=at(11), lease=5, memory=first)
            return rows

        monkeypatch.setattr(Table, "run", racing)
        second_claimed = Intent.objects.claim_many(10, now=at(11), lease=5, memory=second)
        assert [i.id for i in taken] == [ids[0]] and second_claimed == []
        assert (row("a").state, row("a").probe) == ("half_open", ids[0])
        assert untouched(ids) == [("running", 1), ("pending", 0), ("pending", 0)]


def test_a_probe_whose_lease_expires_counts_as_a_failure():
    with settings():
        ids = enqueue(["a", "a"])
        fail("a", 0, 3)
        [probe] = Intent.objects.claim_many(10, now=at(11), lease=5)
        assert claimed_targets(15) == []
        # The probe's lease ran out at 16: the next claim's look reopens the target.
        assert claimed_targets(17) == []
        state = row("a")
        assert (state.state, state.openings, state.until) == ("open", 2, at(37))
        # It is due again after the cooldown: the probe is taken over, not counted twice.
        [again] = Intent.objects.claim_many(10, now=at(38), lease=5)
        assert again.id == probe.id == ids[0] and again.attempts == 2
        assert (row("a").state, row("a").failures) == ("half_open", 4)


def test_a_lease_that_expired_and_was_taken_over_counts_as_a_failure():
    with settings():
        enqueue(["a"])
        Intent.objects.claim_many(1, now=at(1), lease=5)
        [again] = Intent.objects.claim_many(1, now=at(10), lease=5)
        assert again.attempts == 2
        assert (row("a").state, row("a").failures) == ("closed", 1)


def test_an_attempt_running_when_the_target_opens_finishes_and_its_success_closes_it():
    with settings():
        [first, _] = enqueue(["a", "a"])
        running = Intent.objects.claim(now=at(1), lease=30)
        fail("a", 2, 3)
        assert row("a").state == "open"
        assert Intent.objects.complete(first, running.claim_token, now=at(3))
        Intent.objects.record_target_events([event("a", Event.SUCCESS, intent=first)], now=at(3))
        assert row("a") is None
        assert claimed_targets(4) == ["a"]


def claim_plan(vendor: str, targets: int, step: int) -> list[str]:
    """The lines of the plan of a claim with one due intent for each of ``targets``
    targets, every ``step``-th of them held."""
    from django_intents.store.claims import ClaimFilters

    enqueue([f"t{i}" for i in range(targets)])
    Intent.objects.record_target_events(
        [event(f"t{i}", Event.HOLD, until=at(500)) for i in range(0, targets, step)], now=at(0)
    )
    backend = backend_for(connection, Intent)
    [(claim, params)] = backend.claim_queries(now=at(300), limit=8, filters=ClaimFilters())
    explain = "EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN "
    with backend.cursor() as cursor:
        cursor.execute(f"{explain}{claim}", params)
        return [" ".join(map(str, line)) for line in cursor.fetchall()]


def test_the_claims_read_the_held_targets_as_one_set_not_a_lookup_per_row(vendor):
    """The plan of the claim on PostgreSQL: the claim index walked in order, the
    targets read once (a hashed subplan), whatever the number of rows."""
    if vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    plan = "\n".join(claim_plan(vendor, 200, 7))
    assert "hashed SubPlan" in plan or "hashed subplan" in plan.lower(), plan
    scans = [line for line in plan.splitlines() if f"on {TargetState._meta.db_table}" in line]
    assert len(scans) == 3, plan  # once per priority branch, not once per row
    got = claimed_targets(300, limit=200)
    assert len(got) == 200 - len(range(0, 200, 7))
    assert not {f"t{i}" for i in range(0, 200, 7)} & set(got)


def test_the_claims_look_a_walked_rows_target_up_by_kind_and_target(vendor):
    """SQLite's and MariaDB's plan: a lookup per walked row on the (kind, target)
    index. Left to its statistics, MariaDB took the (kind, state) index and read
    every blocking row of the kind for each row it walked: a claim past 300 held
    targets cost ten times one past none (bench/target_health.py)."""
    if vendor == "postgresql":
        pytest.skip("PostgreSQL reads the blocking rows as one set (the test above)")
    plan = claim_plan(vendor, 60, 2)
    lookups = [line for line in plan if "intents_targets_" in line]
    assert lookups, "\n".join(plan)
    assert all("intents_targets_kind_target" in line for line in lookups), "\n".join(plan)
    assert all("intents_targets_kind_state" not in line for line in lookups), "\n".join(plan)
    got = claimed_targets(300, limit=60)
    assert sorted(got) == sorted(f"t{i}" for i in range(1, 60, 2))


def test_the_breaker_applies_to_limited_claims_too():
    with settings(breaker=BREAKER, per_target=2, running=10):
        ids = enqueue(["a", "a", "b"])
        fail("a", 0, 3)
        assert claimed_targets(5) == ["b"]
        [probe] = Intent.objects.claim_many(10, now=at(11), lease=5)
        assert probe.id == ids[0]
        assert untouched([ids[1]]) == [("pending", 0)]


@pytest.mark.parametrize("policy", [{"rate": "100/s"}, {"ordered": True}], ids=str)
def test_a_held_or_open_target_is_left_out_of_the_claims_of_rated_and_ordered_kinds(policy):
    """Those claims read the due rows with a statement of their own (store/limited.py);
    on PostgreSQL it once left the held and open targets in, and a down partner
    beside a rated kind got every attempt its intents had."""
    with settings(breaker=BREAKER, **policy):
        ids = enqueue(["a", "a", "b", "c"])
        free = enqueue(["a", "b"], kind=FREE)
        fail("a", 0, 3)
        Intent.objects.record_target_events([event("b", Event.HOLD, until=at(60))], now=at(0))
        assert row("a").state == "open" and row("b").state == "held"
        assert claimed_targets(5, kinds=[HOOK], paced=5) == ["c"]  # within the cooldown
        assert claimed_targets(5) == ["a", "b"]  # the other kind's, whose targets are fine
        assert untouched(ids[:3]) == [("pending", 0)] * 3
        assert untouched(free) == [("running", 1)] * 2


def test_until_is_kept_in_the_database_in_utc():
    Intent.objects.record_target_events([event("a", Event.HOLD, until=at(60))], now=at(0))
    assert row("a").until - row("a").updated_at == timedelta(seconds=60)


# -- what the pool's recorder counts (worker/recorder.py) ----------------------------


def recorded(outcomes: list[tuple[Outcome, str | None]], target: str = "a") -> list[Outcome]:
    """Claim one intent per outcome, hand each back with it, record them in one batch."""
    ids = [Intent.objects.enqueue(HOOK, f"r{next(EVENTS)}", target) for _ in outcomes]
    claimed = sorted(
        Intent.objects.claim_many(len(outcomes), kinds=[HOOK], lease=60),
        key=lambda intent: ids.index(intent.id),
    )
    assert [intent.id for intent in claimed] == ids
    recorder = Recorder(Intent.objects, max_attempts=None, wake=lambda: None)
    for intent, (outcome, cause) in zip(claimed, outcomes, strict=True):
        claim = Claim(intent, Attempt(intent), handler=print, outcome=outcome, cause=cause)
        if outcome is Outcome.SNOOZED:
            claim.due, claim.hold = timezone.now() + timedelta(seconds=60), cause == "hold"
        assert recorder.add(claim) is None
    return [outcome for _, outcome in recorder.record()]


def test_the_recorder_counts_errors_and_timeouts_not_snoozes_nor_stops():
    with settings(breaker={"failures": 3, "cooldown": 30}):
        recorded([(Outcome.ERROR, "boom"), (Outcome.SNOOZED, "later"), (Outcome.STOPPED, "gone")])
        assert (row("a").state, row("a").failures) == ("closed", 1)
        recorded([(Outcome.TIMEOUT, "timed out after 1 s")], target="a")
        assert (row("a").state, row("a").failures) == ("closed", 2)
        recorded([(Outcome.ERROR, "boom")], target="a")
        state = row("a")
        assert (state.state, state.failures, state.last_error) == ("open", 3, "boom")
        waiting = Intent.objects.filter(target="a", state="pending")
        assert waiting.count() == 4 and not Intent.objects.filter(state="running").exists()


def test_the_recorder_writes_a_hold_of_any_kind_and_a_success_resets_the_count():
    recorded([(Outcome.SNOOZED, "hold")], target="h")
    assert row("h").state == "held"
    with settings(breaker={"failures": 3, "cooldown": 30}):
        recorded([(Outcome.ERROR, "boom"), (Outcome.ERROR, "boom")], target="b")
        assert row("b").failures == 2
        recorded([(Outcome.SUCCESS, None)], target="b")
        assert row("b") is None


def test_a_success_written_by_the_handlers_atomic_block_resets_the_count():
    with settings(breaker={"failures": 3, "cooldown": 30}):
        recorded([(Outcome.ERROR, "boom"), (Outcome.ERROR, "boom")], target="c")
        Intent.objects.enqueue(HOOK, "c-atomic", "c")
        [intent] = Intent.objects.claim_many(1, kinds=[HOOK], lease=60)
        attempt = Attempt(intent)
        with attempt.atomic():
            pass
        recorder = Recorder(Intent.objects, max_attempts=None, wake=lambda: None)
        claim = Claim(intent, attempt, handler=print, outcome=Outcome.SUCCESS)
        assert recorder.add(claim) is Outcome.SUCCESS
        assert row("c") is None
        assert Intent.objects.get(id=intent.id).state == "completed"
