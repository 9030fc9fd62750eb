"""``LIMITS[kind]["rate"]`` (SPEC §14) in the claims, time driven by ``now=``.

The window's arithmetic is ``rules.targets.Rate`` (``test_target_rules.py``);
the claim that applies it under the kinds' lock is ``store/limited.py``, on
every database. Real worker processes are in ``test_rates_process.py``.
Every test checks the rows: intents over the rate stay pending, untouched,
in their place, with no attempt burnt.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_intents.models import Intent, TargetStart
from django_intents.rules.targets import Rate
from django_intents.store.claims import ClaimFilters

from .conftest import at, external_kinds, intents
from .test_limits import EXPLAIN

pytestmark = pytest.mark.django_db(transaction=True)

HOOK, FREE = "r.hook", "r.free"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(HOOK, FREE):
        yield


def rated(rate: str = "2/10s", **more: Any) -> Any:
    """``INTENTS`` with a rate (and maybe caps) for the hook kind."""
    declared = [*intents().get("EXTERNAL_KINDS", ()), HOOK, FREE]
    return override_settings(
        INTENTS=intents(EXTERNAL_KINDS=declared, LIMITS={HOOK: {"rate": rate, **more}})
    )


def enqueue(targets: list[str], kind: str = HOOK, start: float = 0.0) -> list[str]:
    """One intent per entry of ``targets``, due a millisecond apart, in that order."""
    return [
        Intent.objects.enqueue(kind, f"{kind}-{start}-{i}", target, now=at(start + i / 1000))
        for i, target in enumerate(targets)
    ]


def untouched(ids: list[str]) -> bool:
    """Every one of ``ids`` is still pending, never claimed."""
    rows = Intent.objects.filter(id__in=ids)
    return len(rows) == len(ids) and all(
        (r.state, r.attempts, r.claim_token) == ("pending", 0, "") for r in rows
    )


def claim(n: int, seconds: float, **kwargs: Any) -> list[str]:
    return [i.id for i in Intent.objects.claim_many(n, now=at(seconds), **kwargs)]


def test_at_most_n_start_per_window_and_the_rest_wait_pending_in_order():
    ids = enqueue(["a"] * 5)
    with rated("2/10s"):
        assert claim(10, 60) == ids[:2]
        assert claim(10, 65) == []
        assert claim(10, 69.999) == []
    assert untouched(ids[2:])
    assert TargetStart.objects.filter(kind=HOOK, target="a").count() == 2


def test_a_single_claim_applies_the_rate_too():
    ids = enqueue(["a", "a"])
    with rated("1/10s"):
        first = Intent.objects.claim(now=at(60))
        assert Intent.objects.claim(now=at(61)) is None
    assert first is not None and first.id == ids[0]
    assert untouched(ids[1:])


def test_the_next_starts_once_the_window_slides_past_the_oldest_start():
    ids = enqueue(["a"] * 5)
    with rated("2/10s"):
        assert claim(1, 60) == ids[:1]
        assert claim(1, 64) == ids[1:2]
        # A start counts for the window and its margin (a second here: Rate.margin).
        assert claim(10, 70.9) == []
        assert claim(10, 71) == ids[2:3]  # the start at 60 left (60, 71]; the one at 64 did not
        assert claim(10, 74.9) == []
        assert claim(10, 75) == ids[3:4]
    assert untouched(ids[4:])


def test_targets_are_rated_apart_and_the_claim_passes_a_spent_one_in_order():
    ids = enqueue(["a", "a", "a", "b", "a", "c", "b", "b"])
    with rated("2/10s"):
        assert claim(10, 60) == [ids[0], ids[1], ids[3], ids[5], ids[6]]
    assert untouched([ids[2], ids[4], ids[7]])


def test_a_claim_says_when_the_first_spent_target_may_start_again():
    enqueue(["a", "a", "a", "b", "b"])
    with rated("2/10s"):
        first = Intent.objects.claim_many(1, now=at(60))
        second = Intent.objects.claim_many(10, now=at(61))
        third = Intent.objects.claim_many(10, now=at(62))
    assert first.next_start is None  # target a has room for one more
    assert second.held_back
    # a started at 60 and 61; b at 61 and 61; a start counts 10 s and a 1 s margin
    assert second.next_start == at(71)
    assert (len(third), third.next_start) == (0, at(71))


def test_an_expired_lease_claimed_again_is_a_new_start():
    [first, *_] = ids = enqueue(["a"] * 3)
    with rated("2/10s"):
        assert claim(1, 60, lease=1) == [first]
        assert claim(1, 62) == [first]  # its lease ran out: taken over, a second start
        assert claim(10, 63) == []
    assert Intent.objects.get(id=first).attempts == 2
    assert untouched(ids[1:])


def test_the_rate_composes_with_per_target_and_running():
    ids = enqueue(["a", "a", "a", "b", "b", "c"])
    with rated("2/10s", per_target=1, running=2):
        assert claim(10, 60) == [ids[0], ids[3]]  # running caps the kind at 2
        for intent in Intent.objects.filter(state="running"):
            assert Intent.objects.complete(intent.id, intent.claim_token, now=at(61))
        # per_target lets a and b run one more each; a has 1 start of 2 left
        assert claim(10, 62) == [ids[1], ids[4]]
        for intent in Intent.objects.filter(state="running"):
            assert Intent.objects.complete(intent.id, intent.claim_token, now=at(63))
        # a and b spent their 2 starts until 71 (the window and its margin): only c
        assert claim(10, 64) == [ids[5]]
        assert claim(10, 71) == [ids[2]]
    assert Intent.objects.filter(state="pending").count() == 0


def test_kinds_without_a_rate_claimed_alongside_are_not_held_back():
    hooks = enqueue(["a", "a", "a"])
    free = enqueue(["a", "a", "a"], kind=FREE, start=10)
    with rated("1/10s"):
        assert claim(10, 60) == [hooks[0], *free]
        assert claim(10, 61, kinds=[FREE]) == []
    assert untouched(hooks[1:])
    assert TargetStart.objects.filter(kind=FREE).count() == 0


def test_paced_caps_the_rated_intents_of_one_claim_and_not_the_others():
    hooks = enqueue(["a", "b", "c"])
    free = enqueue(["a", "a"], kind=FREE, start=10)
    with rated("5/10s"):
        assert claim(10, 60, paced=1) == [hooks[0], *free]
        held = Intent.objects.claim_many(10, now=at(61), paced=0)
        # Left out of the scan, not passed over: the pool's floor stays below them.
        assert (list(held), held.held_back) == ([], True)
        assert untouched(hooks[1:])
        assert claim(10, 62, paced=5) == hooks[1:]
    assert TargetStart.objects.filter(kind=HOOK).count() == 3


@pytest.mark.parametrize("paced", [-1, 1.5, True, "2"])
def test_claim_many_refuses_a_paced_that_is_not_a_count_and_claims_nothing(paced):
    hooks = enqueue(["a"])
    with rated(), pytest.raises(ValueError, match="paced must be a non-negative integer"):
        Intent.objects.claim_many(1, now=at(60), paced=paced)
    assert untouched(hooks)
    assert TargetStart.objects.count() == 0


def test_a_paused_rated_kind_is_not_claimed_and_uses_no_start():
    ids = enqueue(["a", "a"])
    with rated("2/10s"):
        Intent.objects.pause(HOOK)
        assert claim(10, 60) == []
        Intent.objects.resume(HOOK)
        assert claim(10, 61) == ids
    assert TargetStart.objects.filter(kind=HOOK).count() == 2


def test_priority_orders_what_the_rate_admits():
    low = enqueue(["a", "a"])
    high = Intent.objects.enqueue(HOOK, "urgent", "a", priority=5, now=at(30))
    with rated("1/10s"):
        assert claim(10, 60) == [high]
        assert claim(10, 71) == [low[0]]
    assert untouched(low[1:])


def test_starts_older_than_the_window_are_pruned_by_the_claims():
    enqueue(["a"] * 6)
    with rated("1/10s"):
        for second in (60, 71, 82, 93):  # a window and its 1 s margin apart
            assert len(claim(10, second, lease=300)) == 1
    # The claim at 93 wrote its start and pruned those at or before 71: twice
    # the 11 s a start counts, which no claim at 82 or later counts.
    starts = TargetStart.objects.filter(kind=HOOK).values_list("started_at", flat=True)
    assert sorted(starts) == [at(82), at(93)]
    assert Intent.objects.filter(state="pending").count() == 2


def test_a_claim_that_fails_records_no_start_and_claims_nothing(monkeypatch):
    ids = enqueue(["a", "a"])
    from django_intents.store import limited

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(limited, "record_starts", broken)
    with rated("2/10s"), pytest.raises(RuntimeError):
        claim(10, 60)
    assert untouched(ids)
    assert TargetStart.objects.count() == 0


def test_concurrent_claimers_never_start_more_than_the_rate(vendor):
    n_threads = 2 if vendor == "sqlite" else 5
    enqueue([f"t{i % 3}" for i in range(60)])
    starts: list[tuple[str, float]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def claimer() -> None:
        try:
            barrier.wait()
            for step in range(12):
                now = 100 + step * 0.5
                for intent in Intent.objects.claim_many(3, now=at(now)):
                    starts.append((intent.target, now))
                    Intent.objects.complete(intent.id, intent.claim_token, now=at(now))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with rated("3/2s"):
        threads = [threading.Thread(target=claimer) for _ in range(n_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    per_target: dict[str, list[float]] = {}
    for target, now in starts:
        per_target.setdefault(target, []).append(now)
    assert set(per_target) == {"t0", "t1", "t2"}
    for target, times in per_target.items():
        for end in times:
            in_window = [t for t in times if end - 2 < t <= end]
            assert len(in_window) <= 3, (target, sorted(times))
    # Claims over 6 s of a 2-s window: at most three full windows per target
    # (the threads' clocks need not agree); what did not start waits, untouched.
    assert all(count <= 9 for count in Counter(t for t, _ in starts).values())
    assert Intent.objects.filter(state="completed").count() == len(starts)
    pending = Intent.objects.filter(state="pending")
    assert pending.count() == 60 - len(starts)
    assert untouched([i.id for i in pending])


def test_the_window_is_measured_on_the_claims_now_not_on_the_clock():
    ids = enqueue(["a"] * 3)
    with rated("1/1h"):
        assert claim(1, 60, lease=7200) == ids[:1]
        assert claim(1, 60 + 3600) == []  # a start counts the hour and a second
        assert claim(1, 60 + 3601, lease=7200) == ids[1:2]
    assert untouched(ids[2:])
    assert TargetStart.objects.filter(started_at__gte=at(60) + timedelta(hours=1)).count() == 1


def test_a_rated_claim_scans_the_claim_index(vendor):
    enqueue([f"t{i % 3}" for i in range(30)])
    filters = ClaimFilters(kinds=[HOOK], rates={HOOK: Rate(1, 10.0)}, full_targets=((HOOK, "t1"),))
    backend = Intent.objects._backend()
    plans = []
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SET enable_seqscan = off")  # 30 rows: a scan would win on cost alone
        for statement, params in backend.scan_queries(now=at(60), limit=10, filters=filters):
            cursor.execute(EXPLAIN[vendor] + statement, params)
            plans.append(" ".join(str(value) for row in cursor.fetchall() for value in row))
        if vendor == "postgresql":
            cursor.execute("RESET enable_seqscan")
    assert plans
    for plan in plans:
        assert "intents_claimable_idx" in plan or "intents_claim" in plan, plan
