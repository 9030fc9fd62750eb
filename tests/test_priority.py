"""``priority`` (SPEC §11): higher first among due intents, in every claim, on every database.

Time is driven by ``now=``; each test checks the rows it claims and leaves.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_intents.models import Intent
from django_intents.store import ClaimFilters, backend_for
from django_intents.store.memory import ClaimMemory
from django_intents.worker.floor import ClaimFloor

from .conftest import T0, at, branch_plan, intents, row, snapshot

pytestmark = pytest.mark.django_db

KIND = "webhook"


def put(name: str, priority: int | None = None, *, due: float = 0.0, **extra: Any) -> str:
    return Intent.objects.enqueue(
        KIND, name, "https://example.com/hook", now=at(due), priority=priority, **extra
    )


def claimed_ids(limit: int, now: float, **kwargs: Any) -> list[str]:
    return [intent.id for intent in Intent.objects.claim_many(limit, now=at(now), **kwargs)]


# -- the argument -------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 1.0, "5", [1]])
def test_a_priority_that_is_not_an_int_is_a_type_error_and_nothing_is_written(value):
    with pytest.raises(TypeError, match=r"^priority must be an int"):
        put("a", value)
    with pytest.raises(TypeError, match=r"^items\[1\]: priority must be an int"):
        Intent.objects.enqueue_many(
            [
                {"kind": KIND, "event_id": "b", "target": "t"},
                {"kind": KIND, "event_id": "c", "target": "t", "priority": value},
            ]
        )
    assert snapshot() == []


@pytest.mark.parametrize("value", [-101, 101, 2**40])
def test_a_priority_out_of_range_is_a_value_error_and_nothing_is_written(value):
    with pytest.raises(ValueError, match=r"^priority must be between -100 and 100"):
        put("a", value)
    assert snapshot() == []


def test_none_and_no_priority_mean_zero_and_the_bounds_are_accepted():
    ids = [put("none", None), put("low", -100), put("high", 100)]
    ids.append(Intent.objects.enqueue(KIND, "omitted", "t", now=T0))
    [many] = Intent.objects.enqueue_many([{"kind": KIND, "event_id": "m", "target": "t"}])
    assert [row(id).priority for id in [*ids, many]] == [0, -100, 100, 0, 0]


def test_enqueue_many_keeps_each_items_priority():
    items = [{"kind": KIND, "event_id": str(p), "target": "t", "priority": p} for p in (7, 0, -3)]
    ids = Intent.objects.enqueue_many(items, now=T0)
    assert [row(id).priority for id in ids] == [7, 0, -3]


def test_the_database_refuses_a_priority_out_of_range_written_past_the_manager():
    from django.db import IntegrityError, transaction

    id = put("a")  # noqa: A001
    with pytest.raises(IntegrityError), transaction.atomic():
        Intent.objects.filter(pk=id).update(priority=500)
    assert row(id).priority == 0


# -- the order ----------------------------------------------------------------------


def test_higher_priority_is_claimed_first_among_due_intents():
    low, zero, high, higher = put("low", -5), put("zero"), put("high", 5), put("higher", 50)
    assert claimed_ids(4, 1) == [higher, high, zero, low]


def test_equal_priorities_keep_next_at_then_created_at_then_id():
    later = put("later", 3, next_at=at(2))
    first = put("first", 3, next_at=at(1))
    b = Intent.objects.enqueue(KIND, "tie", "t", now=T0, priority=3, id="b" * 32, next_at=at(1))
    a = Intent.objects.enqueue(KIND, "tie", "t", now=T0, priority=3, id="a" * 32, next_at=at(1))
    assert claimed_ids(10, 5) == [first, a, b, later]


def test_a_high_priority_intent_not_yet_due_waits_for_its_time():
    zero = put("zero")
    high = put("high", 100, next_at=at(60))
    assert claimed_ids(10, 1, lease=600) == [zero]
    assert row(high).state == "pending"
    assert claimed_ids(10, 61) == [high]


def test_one_claim_takes_the_high_then_the_rest_in_priority_order_up_to_its_limit():
    lows = [put(f"low-{i}", -1, due=i / 10) for i in range(3)]
    zeros = [put(f"zero-{i}", due=i / 10) for i in range(3)]
    highs = [put(f"high-{i}", 1, due=i / 10) for i in range(3)]
    assert claimed_ids(5, 1) == [*highs, *zeros[:2]]
    assert claimed_ids(5, 1) == [zeros[2], *lows]
    assert {row(id).state for id in [*lows, *zeros, *highs]} == {"running"}


@pytest.mark.parametrize("low", [0, -10])
def test_a_thousand_earlier_low_priority_intents_do_not_delay_a_high_one_beyond_one_claim(low):
    items = [
        {"kind": KIND, "event_id": f"low-{i}", "target": "t", "priority": low, "next_at": T0}
        for i in range(1000)
    ]
    Intent.objects.enqueue_many(items, now=T0)
    assert len(claimed_ids(8, 1)) == 8
    high = put("high", 10, due=2)  # enqueued after a first claim
    [first, *rest] = claimed_ids(8, 3)
    assert first == high and high not in rest
    assert row(high).state == "running" and row(high).attempts == 1
    assert Intent.objects.filter(state="running").count() == 16
    assert Intent.objects.filter(state="pending").count() == 1000 - 15


def test_a_claim_without_a_floor_always_takes_the_exact_priority_order():
    zeros = [put(f"zero-{i}", due=i / 10) for i in range(5)]
    memory = ClaimMemory()
    Intent.objects.claim_many(2, now=at(1), since=T0, memory=memory)  # whatever a pool did before
    high = put("high", 1, due=0.5)
    assert claimed_ids(1, 1, memory=memory) == [high]
    assert {row(id).state for id in zeros[2:]} == {"pending"}


def test_a_pool_claims_priority_zero_with_the_plain_statement_until_told_or_run_out(vendor):
    """PostgreSQL: the three branches cost a third more planning than one, so a
    pool's floored claims use the claim of priority 0 alone until the pool's
    listener hears of an intent of another priority, or a claim runs out of
    priority 0; that claim returns at once, and the next walks every branch."""
    if vendor != "postgresql":
        pytest.skip("SQLite and MariaDB claim every branch in one cheap statement")
    from django.test.utils import CaptureQueriesContext

    memory = ClaimMemory()  # a pool's: what its claims remember between turns
    zeros = [put(f"zero-{i}", due=i / 10) for i in range(6)]

    def claim() -> tuple[list[str], str]:
        with CaptureQueriesContext(connection) as queries:
            ids = claimed_ids(2, 1, since=T0, memory=memory)
        return ids, " ".join(q["sql"] for q in queries)

    ids, sql = claim()  # every branch (nothing learned yet), then the plain claim
    assert ids == zeros[:2] and "branch_high" in sql
    ids, sql = claim()
    assert ids == zeros[2:4] and "branch_high" not in sql
    high = put("high", 5, due=0.9)
    ids, sql = claim()  # nobody told it: priority 0 first
    assert ids == [zeros[4], zeros[5]] and "branch_high" not in sql
    assert row(high).state == "pending"
    late = put("late", due=0.95)
    ids, sql = claim()  # priority 0 runs out: it returns what it took, at once
    assert ids == [late] and "branch_high" not in sql
    ids, sql = claim()  # and the next claim walks every branch
    assert ids == [high] and "branch_high" in sql
    ids, sql = claim()  # that took one of another priority: every branch again
    assert ids == [] and "branch_high" in sql
    more = [put(f"more-{i}", due=0.96 + i / 100) for i in range(3)]
    ids, sql = claim()  # and none since: the plain claim
    assert ids == more[:2] and "branch_high" not in sql
    urgent = put("urgent", 9, due=0.99)
    memory.hint(KIND)  # what the listener does when PostgreSQL names the kind
    ids, sql = claim()
    assert ids == [urgent, more[2]] and "branch_high" in sql
    ids, sql = claim()  # that took one of another priority: every branch again, finding none
    assert ids == [] and "branch_high" in sql


def test_a_claim_without_a_pools_memory_has_learned_nothing_and_walks_every_branch(vendor):
    """What a pool's claims learn is the pool's (``ClaimMemory``), not the store's:
    a caller's claim, or another pool's, takes the full claim of every branch."""
    if vendor != "postgresql":
        pytest.skip("SQLite and MariaDB claim every branch in one cheap statement")
    from django.test.utils import CaptureQueriesContext

    memory = ClaimMemory()
    zeros = [put(f"zero-{i}", due=i / 10) for i in range(4)]
    assert claimed_ids(1, 1, since=T0, memory=memory) == zeros[:1]
    assert memory.others_due == {None: False}  # the pool's next claim is the plain one
    with CaptureQueriesContext(connection) as queries:
        assert claimed_ids(1, 1, since=T0) == zeros[1:2]
    assert "branch_high" in queries[-1]["sql"]
    with CaptureQueriesContext(connection) as queries:
        assert claimed_ids(1, 1, since=T0, memory=memory) == zeros[2:3]
    assert "branch_high" not in queries[-1]["sql"]


def test_a_listener_hint_that_arrives_during_a_claim_is_not_cleared_by_it(vendor):
    """The listener runs in its own thread: an urgent intent's NOTIFY may arrive
    while a claim whose snapshot predates the intent is running. That claim saw
    nothing of another priority and must not clear the hint, or the urgent
    intent waits for the pool's full claim (CI once saw 17 intents overtake one)."""
    if vendor != "postgresql":
        pytest.skip("SQLite and MariaDB claim every branch in one statement; no hint")
    from django.test.utils import CaptureQueriesContext

    memory = ClaimMemory()
    zeros = [put(f"zero-{i}", due=i / 10) for i in range(4)]
    claimed_ids(2, 1, since=T0, memory=memory)  # every branch: priority 0 only
    urgent = put("urgent", 9, due=0.9)

    def hint_during(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        memory.hint(KIND)  # the NOTIFY, heard before the claim has returned
        return result

    with connection.execute_wrapper(hint_during), CaptureQueriesContext(connection) as queries:
        taken = claimed_ids(2, 1, since=T0, memory=memory)
    assert taken == zeros[2:] and "branch_high" not in queries[-1]["sql"]
    with CaptureQueriesContext(connection) as queries:
        assert claimed_ids(2, 1, since=T0, memory=memory) == [urgent]
    assert "branch_high" in queries[-1]["sql"]
    assert {row(id).state for id in [*zeros, urgent]} == {"running"}


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_of_another_priority_is_heard_by_a_listening_pool(vendor):
    """The insert names the kind on PRIORITY_CHANNEL too, at commit; the listener
    then tells the claims."""
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    import threading

    from django_intents.worker.wakeup import Listener

    memory = ClaimMemory()
    key = (KIND,)
    woken = threading.Event()
    listener = Listener(using="default", kinds=[KIND], wake=woken.set, on_priority=memory.hint)
    listener.start()
    try:
        assert listener.listening.wait(10)
        memory.others_due[key] = False
        put("plain")
        assert woken.wait(10)
        assert memory.others_due[key] is False  # priority 0 tells nothing
        woken.clear()
        put("urgent", 9)
        assert woken.wait(10)
        deadline = time.monotonic() + 10
        while memory.others_due[key] is not True and time.monotonic() < deadline:
            time.sleep(0.01)
        assert memory.others_due[key] is True
    finally:
        listener.stop()
    assert Intent.objects.filter(state="pending").count() == 2


# -- the floor ----------------------------------------------------------------------


def test_a_floored_claim_still_finds_other_priorities_below_the_floor():
    high = put("high", 5, due=0)
    low = put("low", -5, due=0)
    assert claimed_ids(5, 10, since=at(5)) == [high, low]


def test_a_floored_probe_sees_a_high_priority_intent_below_the_floor():
    backend = backend_for(connection, Intent)
    put("high", 5, due=0)
    assert backend.has_due(now=at(10), filters=ClaimFilters(since=at(5))) is True
    assert backend.has_due(now=at(10), filters=ClaimFilters(kinds=["other"])) is False


def test_a_claim_filled_by_high_priorities_leaves_the_floor_where_it_was():
    zero = put("zero", due=0)
    highs = [put(f"high-{i}", 1, due=5 + i / 10) for i in range(2)]
    floor = ClaimFloor(clock=lambda: 0.5)
    floor.seen(None, at(1), None)  # a full scan at(1) found nothing: the floor is at(-1)
    before = floor.since()
    taken = Intent.objects.claim_many(2, now=at(6))  # the exact order: both highs
    assert [intent.id for intent in taken] == highs
    floor.claimed(before, at(6), taken, 2)  # as if claimed above the floor
    assert floor.since() == before  # priority 0 was never reached: it says nothing of it
    assert claimed_ids(2, 7, since=floor.since()) == [zero]


def test_a_claim_that_reached_priority_zero_raises_the_floor_to_its_oldest_there():
    put("high", 1, due=5)
    zero = put("zero", due=3)
    floor = ClaimFloor(clock=lambda: 0.5)
    taken = Intent.objects.claim_many(5, now=at(10))
    floor.claimed(None, at(10), taken, 5)
    assert floor.since() == min(at(3), at(10) - timedelta(seconds=2))
    assert zero in [intent.id for intent in taken]


# -- limits and the plan ------------------------------------------------------------


def test_a_limited_claim_admits_in_priority_order():
    declared = [*intents().get("EXTERNAL_KINDS", ())]
    settings = intents(EXTERNAL_KINDS=declared, LIMITS={KIND: {"running": 2}})
    with override_settings(INTENTS=settings):
        zero, high, low = put("zero"), put("high", 9), put("low", -9)
        assert claimed_ids(5, 1) == [high, zero]
        assert row(low).state == "pending"


@pytest.mark.django_db(transaction=True)
def test_each_branch_of_the_claim_walks_its_own_index_without_a_sort(vendor):
    """With rows at every priority and fresh statistics, no branch sorts its rows."""
    items = [
        {"kind": KIND, "event_id": str(i), "target": "t", "priority": (i % 3 - 1) * 5}
        for i in range(3000)
    ]
    Intent.objects.enqueue_many(items, now=T0)
    backend = backend_for(connection, Intent)
    [(claim, params)] = backend.claim_queries(
        now=at(1), limit=8, filters=ClaimFilters(since=T0, kinds=[KIND])
    )
    with backend.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(f"ANALYZE {Intent._meta.db_table}")
        explain = "EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN "
        cursor.execute(explain + claim.replace(" FOR UPDATE SKIP LOCKED", ""), params)
        plan = "\n".join(" ".join(str(part) for part in line) for line in cursor.fetchall())
    if vendor == "postgresql":
        for name, index in [
            ("high", "intents_high_priority_idx"),
            ("zero", "intents_claimable_idx"),
            ("low", "intents_low_priority_idx"),
        ]:
            assert f"Index Scan using {index}" in branch_plan(plan, name), plan
        assert "Sort" not in plan, plan
        statement, due = backend.zero_claim_query(
            now=at(1), limit=8, filters=ClaimFilters(since=T0, kinds=[KIND])
        )
        with backend.cursor() as cursor:
            cursor.execute("EXPLAIN " + statement, due)
            plain = "\n".join(line for (line,) in cursor.fetchall())
        assert "Index Scan using intents_claimable_idx" in plain, plain
        assert "Sort" not in plain, plain
    elif vendor == "sqlite":
        for index in ("intents_high_priority_idx", "intents_claimable_idx"):
            assert index in plan, plan
        assert "TEMP B-TREE" not in plan.upper(), plan
    else:
        for index in ("intents_prioritized_mysql_idx", "intents_claim_mysql_idx"):
            assert index in plan, plan
        # Only the expired leases' branch sorts, and it holds only expired leases.
        assert plan.count("filesort") <= 1, plan


def test_a_limited_claim_walks_the_other_priorities_only_after_one_was_seen_due(vendor):
    """PostgreSQL: as the plain claim, a claim of a kind with LIMITS runs the
    branch of priority 0 alone while its lock's statement sees no other
    priority due; once it sees one, it walks every branch for the room it has left
    and its next claim does too, even when the kind was full and it took nothing."""
    if vendor != "postgresql":
        pytest.skip("SQLite and MariaDB claim every branch in one cheap statement")
    from django.test.utils import CaptureQueriesContext

    declared = [*intents().get("EXTERNAL_KINDS", ())]
    settings = intents(EXTERNAL_KINDS=declared, LIMITS={KIND: {"running": 3}})
    memory = ClaimMemory()

    def claim(now: float) -> tuple[list[str], str]:
        with CaptureQueriesContext(connection) as queries:
            ids = claimed_ids(5, now, lease=600, memory=memory)
        return ids, " ".join(q["sql"] for q in queries)

    with override_settings(INTENTS=settings):
        zeros = [put(f"zero-{i}", due=i / 10) for i in range(3)]
        ids, sql = claim(1)  # nothing learned yet: every branch
        assert ids == zeros and "branch_high" in sql
        Intent.objects.filter(pk__in=zeros).update(
            state="pending", claim_token="", claim_until=None
        )
        ids, sql = claim(1)
        assert ids == zeros and "branch_high" not in sql
        high = put("high", 7, due=2)
        ids, sql = claim(3)  # the kind is full; the lock saw the high one: every branch too
        assert ids == [] and "branch_high" in sql
        Intent.objects.filter(pk=zeros[0]).update(
            state="cancelled", claim_token="", claim_until=None
        )
        ids, sql = claim(4)
        assert ids == [high] and "branch_high" in sql
        assert row(high).state == "running"
