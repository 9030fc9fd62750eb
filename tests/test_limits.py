"""``INTENTS["LIMITS"]`` (SPEC §10): what every claim admits, in one process, time driven by ``now=``.

The rule itself is ``django_intents/limits.py``; the claim that applies it
under a lock is ``backends/limited.py``. Real worker processes are in
``test_limits_process.py``. Every test checks the rows: held-back intents
stay pending, untouched, in their place.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_intents.admin.summary import queue_summary
from django_intents.conf import parse
from django_intents.models import Intent
from django_intents.observability import metrics
from django_intents.rules.limits import Limit, held_back
from django_intents.store.claims import ClaimFilters
from django_intents.store.memory import ClaimMemory
from django_intents.store.statements import bind

from .conftest import at, external_kinds, intents, rows_table
from .test_metrics import scrape, series
from .test_worker_pool import background, pool  # noqa: F401 - a fixture, and a helper

pytestmark = pytest.mark.django_db(transaction=True)

HOOK, FREE = "l.hook", "l.free"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(HOOK, FREE):
        yield


def limits(**caps: dict[str, int]) -> Any:
    """``INTENTS`` with ``LIMITS`` for the hook kind (and the test kinds declared)."""
    declared = [*intents().get("EXTERNAL_KINDS", ()), HOOK, FREE]
    return override_settings(INTENTS=intents(EXTERNAL_KINDS=declared, LIMITS={HOOK: caps}))


def enqueue(targets: list[str], kind: str = HOOK, start: float = 0.0) -> list[str]:
    """One intent per entry of ``targets``, due one second apart, in that order."""
    return [
        Intent.objects.enqueue(kind, f"{kind}-{start + i}", target, now=at(start + i))
        for i, target in enumerate(targets)
    ]


def running_per_target() -> Counter[str]:
    return Counter(Intent.objects.filter(state="running").values_list("target", flat=True))


# -- the setting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({}, "is empty"),
        ([("k", {"running": 1})], "must be a dict"),
        ({"k": {}}, "must be a non-empty dict"),
        ({"k": 3}, "must be a non-empty dict"),
        ({"k": {"runing": 2}}, "unknown key(s) runing"),
        ({"k": {"running": 0}}, "['running'] must be a positive integer, not 0"),
        ({"k": {"per_target": -1}}, "['per_target'] must be a positive integer, not -1"),
        ({"k": {"running": 1.5}}, "must be a positive integer, not 1.5"),
        ({"k": {"running": True}}, "must be a positive integer, not True"),
        ({"k": {"per_target": "2"}}, "must be a positive integer, not '2'"),
        ({"": {"running": 1}}, "bad kind ''"),
        ({"a\x00b": {"running": 1}}, "bad kind"),
    ],
)
def test_a_bad_limits_setting_is_one_error_naming_what_is_wrong(value, message):
    built, errors = parse({"LIMITS": value})
    assert len(errors) == 1
    assert str(errors[0]).startswith("INTENTS['LIMITS'] ")
    assert message in str(errors[0])
    assert built.limits == {}


def test_a_bad_limits_setting_fails_the_system_check():
    with (
        override_settings(INTENTS=intents(LIMITS={HOOK: {"per_target": 0}})),
        pytest.raises(SystemCheckError, match=r"INTENTS\['LIMITS'\].*per_target"),
    ):
        call_command("check")


def test_a_good_limits_setting_parses_each_side_or_both():
    built, errors = parse({"LIMITS": {"a": {"running": 3}, "b": {"per_target": 2, "running": 9}}})
    assert errors == []
    assert built.limits == {"a": Limit(running=3), "b": Limit(running=9, per_target=2)}


# -- the claim ---------------------------------------------------------------------


def test_per_target_holds_back_the_rest_of_a_target_and_claims_past_it_in_order():
    ids = enqueue(["dead", "dead", "dead", "dead", "ok-1", "dead", "ok-2", "ok-1"])
    with limits(per_target=2):
        claimed = Intent.objects.claim_many(10, now=at(60))
    assert [i.id for i in claimed] == [ids[0], ids[1], ids[4], ids[6], ids[7]]
    assert running_per_target() == {"dead": 2, "ok-1": 2, "ok-2": 1}
    held = Intent.objects.filter(id__in=[ids[2], ids[3], ids[5]])
    assert {(r.state, r.attempts, r.claim_token, r.next_at) for r in held} == {
        ("pending", 0, "", r.next_at) for r in held
    }
    assert [r.next_at for r in held.order_by("next_at")] == [at(2), at(3), at(5)]


def test_running_caps_the_kind_across_targets_and_the_claim_takes_the_oldest():
    ids = enqueue([f"t{i}" for i in range(6)])
    with limits(running=4):
        first = Intent.objects.claim_many(10, now=at(60))
        second = Intent.objects.claim_many(10, now=at(60))
    assert [i.id for i in first] == ids[:4]
    assert second == []
    assert Intent.objects.filter(state="pending").count() == 2


def test_both_caps_together_admit_what_fits_both():
    ids = enqueue(["a", "a", "a", "b", "b", "c"])
    with limits(running=3, per_target=1):
        claimed = Intent.objects.claim_many(10, now=at(60))
    assert [i.id for i in claimed] == [ids[0], ids[3], ids[5]]


def test_a_single_claim_applies_the_limits_too():
    enqueue(["a", "a"])
    with limits(per_target=1):
        assert Intent.objects.claim(now=at(60)) is not None
        assert Intent.objects.claim(now=at(60)) is None
    assert running_per_target() == {"a": 1}


def test_finishing_an_intent_frees_its_slot_for_the_next_in_order():
    ids = enqueue(["a", "a", "a"])
    with limits(per_target=1):
        [first] = Intent.objects.claim_many(5, now=at(60))
        assert Intent.objects.claim_many(5, now=at(61)) == []
        assert Intent.objects.complete(first.id, first.claim_token, now=at(62))
        [second] = Intent.objects.claim_many(5, now=at(63))
        assert Intent.objects.retry(second.id, second.claim_token, "HTTP 503", now=at(64))
        [third] = Intent.objects.claim_many(5, now=at(65))
    assert (first.id, second.id, third.id) == (ids[0], ids[1], ids[2])


def test_an_expired_lease_frees_its_slot_and_the_claim_may_take_it_over():
    ids = enqueue(["a", "a"])
    with limits(per_target=1):
        [first] = Intent.objects.claim_many(5, now=at(60), lease=10)
        assert Intent.objects.claim_many(5, now=at(69)) == []  # the lease still holds
        [again] = Intent.objects.claim_many(5, now=at(71))
    # The expired claim is the oldest due intent: it is taken over, the other still waits.
    assert (again.id, again.attempts) == (ids[0], 2)
    assert Intent.objects.get(id=ids[1]).state == "pending"


def test_kinds_without_limits_claimed_alongside_are_not_held_back():
    hooks = enqueue(["a", "a", "a"])
    free = enqueue(["a", "a", "a"], kind=FREE, start=10)
    with limits(per_target=1):
        claimed = Intent.objects.claim_many(10, now=at(60))
        only_free = Intent.objects.claim_many(10, now=at(60), kinds=[FREE])
    assert [i.id for i in claimed] == [hooks[0], *free]
    assert only_free == []


def test_a_claim_of_only_a_full_kind_returns_nothing_and_changes_nothing():
    enqueue(["a", "b"])
    with limits(running=1):
        assert len(Intent.objects.claim_many(5, now=at(60), kinds=[HOOK])) == 1
        before = list(Intent.objects.order_by("id").values_list())
        assert Intent.objects.claim_many(5, now=at(61), kinds=[HOOK]) == []
    assert list(Intent.objects.order_by("id").values_list()) == before


@pytest.mark.parametrize(
    "caps, size",
    [
        pytest.param({"running": 4, "per_target": 1}, 3, id="always-short-of-room"),
        # Room for a claim of 2 while no target runs more than 1: on PostgreSQL
        # the claims go back and forth between the plain and the exact claim.
        pytest.param({"running": 6, "per_target": 3}, 2, id="room-comes-and-goes"),
    ],
)
def test_concurrent_claimers_never_exceed_the_limits(vendor, caps, size):
    # SQLite lets one writer in at a time: its threads queue on the busy timeout.
    n_threads = 2 if vendor == "sqlite" else 6
    targets = [f"t{i % 5}" for i in range(60)]
    enqueue(targets)
    seen: list[Counter[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def claimer() -> None:
        try:
            barrier.wait()
            for _ in range(8):
                for intent in Intent.objects.claim_many(size, now=at(100)):
                    seen.append(running_per_target())
                    Intent.objects.complete(intent.id, intent.claim_token, now=at(100))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with limits(**caps):
        threads = [threading.Thread(target=claimer) for _ in range(n_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert seen, "no claim succeeded"
    for counts in seen:
        assert max(counts.values(), default=0) <= caps["per_target"], counts
        assert sum(counts.values()) <= caps["running"], counts
    assert Intent.objects.filter(state="running").count() == 0
    assert Intent.objects.filter(attempts__gt=1).count() == 0


# -- what a claim says about what it held back (the pool's floor) -------------------


def test_a_claim_that_passed_a_full_target_says_it_held_back_an_intent():
    ids = enqueue(["a", "a", "b"])
    with limits(per_target=1):
        claimed = Intent.objects.claim_many(10, now=at(60))
    assert [i.id for i in claimed] == [ids[0], ids[2]]
    assert claimed.held_back
    assert Intent.objects.get(id=ids[1]).state == "pending"


def test_a_claim_with_room_for_all_of_it_holds_nothing_back():
    ids = enqueue(["a", "b", "a", "c"])
    with limits(per_target=5, running=10):
        first = Intent.objects.claim_many(2, now=at(60))
        second = Intent.objects.claim_many(2, now=at(60), since=at(0))
    assert not first.held_back
    assert not second.held_back
    assert [i.id for i in [*first, *second]] == ids
    assert running_per_target() == {"a": 2, "b": 1, "c": 1}


@pytest.mark.parametrize("per_target", [1, 50], ids=["exact", "with-room"])
def test_a_limited_claim_above_a_floor_leaves_out_what_is_below_it(per_target):
    ids = enqueue(["a", "b", "c", "d", "e", "f"])
    with limits(per_target=per_target):
        first = Intent.objects.claim_many(2, now=at(60), since=at(2))
        second = Intent.objects.claim_many(2, now=at(60), since=at(2))
    assert [i.id for i in [*first, *second]] == ids[2:]
    below = Intent.objects.filter(id__in=ids[:2])
    assert [(r.state, r.attempts) for r in below] == [("pending", 0)] * 2


def test_postgresql_claims_plainly_while_there_is_room_and_exactly_when_short(vendor):
    if vendor != "postgresql":
        pytest.skip("the plain claim with room is PostgreSQL's; elsewhere one claim counts")
    ids = enqueue(["a", "a", "a", "b", "c"])
    statements: list[str] = []
    memory = ClaimMemory()  # a pool's: what its claims remember between turns

    def claim() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            claimed = Intent.objects.claim_many(1, now=at(60), since=at(0), memory=memory)
        statements.append(" ".join(q["sql"] for q in queries.captured_queries))
        return [i.id for i in claimed]

    with limits(per_target=2):
        taken = [claim(), claim(), claim(), claim()]
    # 1: plain, every branch (other priorities unknown); 2: plain, priority 0
    # alone, room for 1 more of "a"; 3: "a" is full, so the plain claim takes
    # nothing and the exact one passes "a"; 4: exact at once, for TIGHT_FOR.
    assert taken == [[ids[0]], [ids[1]], [ids[3]], [ids[4]]]
    plain = ["SELECT cl.*, room.ok" in sql for sql in statements]
    branches = ["branch_high" in sql for sql in statements]
    exact = ["rk AS (" in sql for sql in statements]
    assert plain == [True, True, True, False]
    assert branches == [True, False, False, False]
    assert exact == [False, False, True, True]
    assert Intent.objects.get(id=ids[2]).state == "pending"


def test_postgresql_stays_plain_while_the_fullest_target_has_room_whatever_the_others_hold(
    vendor,
):
    """The gate counts per target: four targets with two running each leave a
    ``per_target`` of 4 room for a claim of 1, though eight leases run."""
    if vendor != "postgresql":
        pytest.skip("the plain claim with room is PostgreSQL's; elsewhere one claim counts")
    ids = enqueue(["a", "b", "c", "d"] * 3)
    with limits(per_target=4), CaptureQueriesContext(connection) as queries:
        taken = [Intent.objects.claim_many(2, now=at(60 + i)) for i in range(4)]
        assert running_per_target() == {"a": 2, "b": 2, "c": 2, "d": 2}
        taken.append(Intent.objects.claim_many(1, now=at(65)))
    claims = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"]]
    assert len(claims) == 5
    assert all("SELECT cl.*, room.ok" in sql and "rk AS (" not in sql for sql in claims)
    assert [i.id for claim in taken for i in claim] == ids[:9]
    assert Counter(i.state for i in Intent.objects.all()) == {"running": 9, "pending": 3}


def test_postgresql_claims_plainly_what_fits_when_a_claim_outgrows_a_wide_cap(vendor):
    """A pool whose queue has just grown asks for more than the fullest target
    leaves under a wide cap: with three quarters of it fitting, it takes what
    fits plainly rather than claim exactly, and says it may have held some
    back (it did not ask for them)."""
    if vendor != "postgresql":
        pytest.skip("the plain claim with room is PostgreSQL's; elsewhere one claim counts")
    ids = enqueue(["a"] * 12)
    with limits(per_target=8):
        first = Intent.objects.claim_many(2, now=at(60))
        with CaptureQueriesContext(connection) as queries:
            second = Intent.objects.claim_many(8, now=at(61))  # 6 of 8 fit
        third = Intent.objects.claim_many(8, now=at(62))
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert sql.count("SELECT cl.*, room.ok") == 2 and "rk AS (" not in sql
    assert (len(first), len(second), len(third)) == (2, 6, 0)  # 2 + 6 = the cap of 8
    assert second.held_back and not second.bound  # not asked for; no target near its cap
    assert third.held_back and third.bound
    assert [i.id for i in [*first, *second]] == ids[:8]
    assert Counter(i.state for i in Intent.objects.all()) == {"running": 8, "pending": 4}


EXPLAIN = {"postgresql": "EXPLAIN ", "mysql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN "}


def test_the_limited_claim_scans_the_claim_index(vendor):
    enqueue([f"t{i % 3}" for i in range(30)])
    filters = ClaimFilters(
        kinds=[HOOK], limits={HOOK: Limit(per_target=1)}, full_targets=((HOOK, "t1"),)
    )
    backend = Intent.objects._backend()
    plans = []
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SET enable_seqscan = off")  # 30 rows: a scan would win on cost alone
        for statement, params in backend.candidate_queries(now=at(60), limit=10, filters=filters):
            # PostgreSQL's is the whole claim: what it takes after the scan is not planned on.
            cursor.execute(EXPLAIN[vendor] + statement, params)
            plans.append(" ".join(str(value) for row in cursor.fetchall() for value in row))
        if vendor == "postgresql":
            cursor.execute("RESET enable_seqscan")
    assert plans
    for plan in plans:
        assert "intents_claimable_idx" in plan or "intents_claim" in plan, plan


def test_postgresql_asks_whether_other_priorities_are_due_of_their_small_indexes(vendor):
    """The planner's worst case: statistics from a time when most intents had
    another priority, then a relay's backlog of priority 0 that no ANALYZE has
    seen. On a temporary copy of the table (its indexes too), so that the
    statistics stay there and no other test plans with them."""
    if vendor != "postgresql":
        pytest.skip("the flag of the exact claim's lock is PostgreSQL's")
    import re

    from django_intents.store.postgresql.limited import lock_key

    table, copy = rows_table(connection), "planner_copy"
    rows = (
        f"INSERT INTO {copy} (id, kind, event_id, target, state, attempts, snoozes, "
        "created_at, updated_at, next_at, last_error, claim_token, priority) "
        "SELECT md5(%s || i), %s, %s || i, 't' || (i %% 20), 'pending', 0, 0, "
        "%s, %s, %s, '', '', %s FROM generate_series(1, %s) AS i"
    )
    backend = Intent.objects._backend()
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMPORARY TABLE {copy} (LIKE {table} INCLUDING ALL)")
        try:
            for priority in (5, -5):
                cursor.execute(
                    rows, [f"p{priority}", HOOK, "p", at(0), at(0), at(0), priority, 1000]
                )
            cursor.execute(f"ANALYZE {copy}")
            cursor.execute(f"DELETE FROM {copy}")
            cursor.execute(rows, ["e", HOOK, "e", at(0), at(0), at(0), 0, 20000])
            statement, params = bind(
                backend.sql.limit_lock.replace(backend.table.live, copy),
                {"now": at(60), "limited": [HOOK], "keys": [lock_key(HOOK)]},
            )
            cursor.execute("EXPLAIN " + statement, params)
            plan = " ".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute(f"DROP TABLE {copy}")
    # Not a scan of the table, nor of the claim index or (kind, state): each of
    # them reads the whole backlog. The copies of the two small indexes are
    # named for their columns, (priority, next_at, created_at, id).
    used = re.findall(r"(?:Index Scan using|Index Scan on) (\S+)", plan)
    assert f"Seq Scan on {copy}" not in plan, plan
    assert len(used) == 2, plan
    assert all(name.startswith(f"{copy}_priority_next_at") for name in used), plan


def test_postgresql_holds_the_kinds_lock_for_the_claim_or_the_callers_transaction(vendor):
    if vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's")
    from django_intents.store.postgresql.limited import lock_key

    enqueue(["a", "b", "c"])

    def free_elsewhere() -> bool:
        """Whether another connection could take the kind's lock right now."""
        result: list[bool] = []

        def probe() -> None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [lock_key(HOOK)])
                    result.append(cursor.fetchone()[0])
            finally:
                connections.close_all()

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join(10)
        return result == [True]

    with limits(per_target=1):
        # In autocommit the lock and the claim are one transaction, over when it returns.
        assert len(Intent.objects.claim_many(1, now=at(60))) == 1
        assert free_elsewhere()
        # Inside the caller's transaction the claim's rows are not visible to
        # other claims until it commits, so neither is the lock released.
        with transaction.atomic():
            assert len(Intent.objects.claim_many(1, now=at(60))) == 1
            assert not free_elsewhere()
        assert free_elsewhere()
    assert running_per_target() == {"a": 1, "b": 1}


def test_postgresql_a_limited_claim_that_fails_changes_nothing_and_frees_the_lock(vendor):
    if vendor != "postgresql":
        pytest.skip("the one-round-trip lock and claim are PostgreSQL's")
    from django.db import DataError

    from django_intents.store.postgresql.limited import lock_key

    ids = enqueue(["a", "b"])
    before = list(Intent.objects.order_by("id").values_list())
    backend = Intent.objects._backend()
    filters = ClaimFilters(kinds=[HOOK], limits={HOOK: Limit(per_target=1)})
    # The claim statement fails on the server after the locks were granted.
    with pytest.raises(DataError):
        backend.limited.locked(
            ("SELECT 1 / (count(*) - count(*)) FROM django_intents_intent", []), filters=filters
        )
    probe: list[bool] = []

    def other_connection() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [lock_key(HOOK)])
                probe.append(cursor.fetchone()[0])
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_connection)
    thread.start()
    thread.join(10)
    assert probe == [True]  # the failed transaction released the kinds' lock
    assert list(Intent.objects.order_by("id").values_list()) == before
    with limits(per_target=1):  # and the connection claims again
        assert [i.id for i in Intent.objects.claim_many(5, now=at(60))] == ids


# -- what a limit holds back: the admin, the gauge, the drain ------------------------


def test_held_back_counts_what_does_not_fit_per_target_and_per_kind():
    limits_ = {"k": Limit(running=5, per_target=2)}
    due = {("k", "a"): 10, ("k", "b"): 1, ("other", "a"): 7}
    assert held_back(limits_, due, {("k", "a"): 1}) == {"k": 11 - 2}
    assert held_back(limits_, due, {("k", "a"): 2, ("k", "c"): 2}) == {"k": 11 - 1}


def test_admin_summary_and_gauge_show_how_many_due_intents_a_limit_holds_back(admin_client):
    enqueue(["a", "a", "a", "a", "b"], start=-100)
    with limits(per_target=1):
        claimed = Intent.objects.claim_many(10)
        assert len(claimed) == 2
        summary = queue_summary()
        [kind] = [k for k in summary.kinds if k.kind == HOOK]
        assert (summary.limits, kind.limited, kind.limit) == (True, 3, "per target ≤ 1")
        page = admin_client.get("/admin/django_intents/intent/").content.decode()
        assert 'data-limited="3"' in page
        assert "Held back by a limit" in page
        metrics.QUEUE.invalidate()
        with override_settings(
            INTENTS={**intents(LIMITS={HOOK: {"per_target": 1}}), "METRIC_KINDS": [HOOK]}
        ):
            samples = scrape(admin_client)
    assert samples[series("django_intents_limited", kind=HOOK)] == 3
    assert Intent.objects.filter(state="pending", attempts=0).count() == 3


def test_a_drain_waits_for_a_slot_held_elsewhere_instead_of_leaving_intents_behind(
    background,  # noqa: F811 - the fixture
):
    ids = [Intent.objects.enqueue(HOOK, f"e{i}", "a") for i in range(2)]
    ran: list[str] = []
    with limits(per_target=1):
        held = Intent.objects.claim()  # another pool's slot, for 0.5 s
        assert held is not None and held.id == ids[0]

        def complete_elsewhere() -> None:
            Intent.objects.complete(held.id, held.claim_token)
            connections.close_all()

        timer = threading.Timer(0.5, complete_elsewhere)
        timer.start()
        try:
            status = background(
                pool({HOOK: lambda intent, attempt: ran.append(intent.id)}, drain=True)
            ).join()
        finally:
            timer.join()
    assert status == 0
    assert ran == [ids[1]]
    assert set(Intent.objects.values_list("state", flat=True)) == {"completed"}


def test_without_limits_the_same_intents_are_all_claimed():
    enqueue(["a", "a", "a"])
    assert len(Intent.objects.claim_many(10, now=at(60))) == 3


def test_postgresql_limited_claims_plan_without_bitmap_scans_in_their_transaction_only(vendor):
    """The lease index is partial on "running", so every claim and completion
    leaves an entry in it until a vacuum. A bitmap scan never marks such entries
    dead and visits all of them on each claim (a relay's: 13,000 entries, 6 ms);
    the lock statement turns bitmaps off for the claim's transaction, so the
    live leases are counted by a plain index scan, which marks them."""
    if vendor != "postgresql":
        pytest.skip("the bitmap scans are PostgreSQL's")
    from django_intents.store.postgresql.limited import lock_key

    enqueue([f"t{i % 3}" for i in range(30)])
    with limits(per_target=2):
        Intent.objects.claim_many(4, now=at(60))
    filters = ClaimFilters(kinds=[HOOK], limits={HOOK: Limit(per_target=2)})
    backend = Intent.objects._backend()
    [(statement, params)] = backend.candidate_queries(now=at(61), limit=10, filters=filters)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(*bind(backend.sql.limit_lock_only, {"keys": [lock_key(HOOK)]}))
        cursor.execute("SHOW enable_bitmapscan")
        assert cursor.fetchone()[0] == "off"
        cursor.execute("EXPLAIN " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Bitmap" not in plan, plan
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_bitmapscan")
        assert cursor.fetchone()[0] == "on"
    assert Counter(i.state for i in Intent.objects.all()) == {"pending": 26, "running": 4}
