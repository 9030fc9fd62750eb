"""Batch transitions and the due probe: ``complete_many``, ``finish_many`` and ``has_due``."""

import pytest
from django.db import connection, transaction

from django_intents.models import Intent
from django_intents.store.base import Ending
from django_intents.store.statements import spread

from .conftest import T0, at, enqueue, row, snapshot

pytestmark = pytest.mark.django_db


def claimed(n: int, lease: float = 30) -> list[tuple[str, str]]:
    enqueue(n)
    return [(i.id, i.claim_token) for i in Intent.objects.claim_many(n, now=T0, lease=lease)]


def test_complete_many_completes_every_held_claim_and_returns_ids_in_order():
    pairs = claimed(3)
    assert Intent.objects.complete_many(pairs, now=at(5)) == [id for id, _ in pairs]
    for id, _ in pairs:
        intent = row(id)
        assert (intent.state, intent.claim_token, intent.claim_until) == ("completed", "", None)
        assert (intent.updated_at, intent.attempts) == (at(5), 1)


def test_complete_many_skips_a_stale_token_and_completes_the_rest():
    (a, token_a), (b, token_b) = claimed(2)
    assert Intent.objects.complete_many([(a, "0" * 32), (b, token_b)], now=at(1)) == [b]
    assert row(a).state == "running"
    assert row(a).claim_token == token_a
    assert row(b).state == "completed"


def test_complete_many_skips_an_intent_taken_over_after_its_lease_expired():
    [(id, old)] = claimed(1, lease=10)
    new = Intent.objects.claim(now=at(11), lease=10).claim_token
    assert Intent.objects.complete_many([(id, old)], now=at(12)) == []
    assert row(id).claim_token == new
    assert Intent.objects.complete_many([(id, new)], now=at(12)) == [id]


def test_complete_many_leaves_pending_completed_and_cancelled_intents_alone():
    pairs = claimed(3)
    (a, ta), (b, tb), (c, tc) = pairs
    Intent.objects.complete(a, ta, now=at(1))
    Intent.objects.cancel(b, now=at(1))
    Intent.objects.retry_now(c, now=at(1))
    before = snapshot()
    assert Intent.objects.complete_many(pairs, now=at(2)) == []
    assert snapshot() == before


def test_complete_many_of_nothing_is_a_no_op(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert Intent.objects.complete_many([]) == []


def test_complete_many_uses_one_query_per_batch_on_returning_databases(
    django_assert_max_num_queries,
):
    first, *pairs = claimed(21)
    # The first completion of a day on PostgreSQL makes the day's partition, once.
    assert Intent.objects.complete_many([first], now=at(1)) == [first[0]]
    # MariaDB locks, then updates: two statements and the transaction around them.
    # PostgreSQL: one statement, and, when another test's transaction held the
    # table as the day's partition was made, the making again (four more).
    from django.db import connection

    with django_assert_max_num_queries(8 if connection.vendor == "postgresql" else 4):
        assert len(Intent.objects.complete_many(pairs, now=at(1))) == 20


def test_complete_many_splits_large_batches_and_completes_them_all():
    pairs = claimed(1100)
    assert len(Intent.objects.complete_many(pairs, now=at(1))) == 1100
    assert Intent.objects.filter(state="completed").count() == 1100


def test_complete_many_ignores_a_pair_given_twice():
    pairs = claimed(1)
    assert Intent.objects.complete_many(pairs * 2, now=at(1)) == [pairs[0][0]]


def test_complete_many_refuses_a_bad_id_before_writing():
    pairs = claimed(1)
    before = snapshot()
    with pytest.raises(ValueError):
        Intent.objects.complete_many([*pairs, ("", "x")], now=at(1))
    with pytest.raises(TypeError):
        Intent.objects.complete_many([(pairs[0][0], None)], now=at(1))
    with pytest.raises(TypeError):
        Intent.objects.complete_many("abc", now=at(1))
    assert snapshot() == before


def test_complete_many_announces_the_completed_kinds_after_commit(
    django_capture_on_commit_callbacks, announced
):
    pairs = claimed(2)
    announced.clear()
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        Intent.objects.complete_many([*pairs, (pairs[0][0], "0" * 32)], now=at(1))
        assert announced == []
    assert announced == [("completed", ["webhook", "webhook"])]


def test_complete_many_inside_a_rolled_back_transaction_changes_nothing():
    pairs = claimed(2)
    before = snapshot()
    with pytest.raises(RuntimeError), transaction.atomic():
        Intent.objects.complete_many(pairs, now=at(1))
        raise RuntimeError("roll back")
    assert snapshot() == before


def test_finish_many_retries_cancels_and_releases_held_claims_and_skips_a_stale_token():
    (a, ta), (b, tb), (c, tc), (d, td) = claimed(4)
    endings = [
        Ending(a, ta, "pending", next_at=at(60), error="KeyError: 'x'"),
        Ending(b, tb, "cancelled", error="gone for good"),
        Ending(c, tc, "pending", next_at=at(2)),
        Ending(d, "0" * 32, "cancelled", error="stale"),
    ]
    assert sorted(Intent.objects.finish_many(endings, now=at(2))) == sorted([a, b, c])
    retried, cancelled, released, untouched = row(a), row(b), row(c), row(d)
    assert (retried.state, retried.next_at, retried.last_error) == (
        "pending",
        at(60),
        "KeyError: 'x'",
    )
    assert (cancelled.state, cancelled.last_error, cancelled.next_at) == (
        "cancelled",
        "gone for good",
        T0,
    )
    assert (released.state, released.next_at, released.last_error) == ("pending", at(2), "")
    for intent in (retried, cancelled, released):
        assert (intent.claim_token, intent.claim_until, intent.updated_at) == ("", None, at(2))
        assert intent.attempts == 1
    assert (untouched.state, untouched.claim_token) == ("running", td)


def test_finish_many_takes_back_the_attempt_of_an_unstarted_release_only():
    (a, ta), (b, tb), (c, tc) = claimed(3)
    endings = [
        Ending(a, ta, "pending", next_at=at(2), unstarted=True),
        Ending(b, tb, "pending", next_at=at(2)),
        Ending(c, "0" * 32, "pending", next_at=at(2), unstarted=True),
    ]
    assert sorted(Intent.objects.finish_many(endings, now=at(2))) == sorted([a, b])
    assert [(row(i).state, row(i).attempts) for i in (a, b)] == [("pending", 0), ("pending", 1)]
    assert (row(c).state, row(c).attempts) == ("running", 1)  # a stale token: untouched


@pytest.mark.parametrize(
    "ending",
    [
        {"state": "cancelled", "unstarted": True},
        {"state": "pending", "unstarted": True, "snooze": True},
    ],
)
def test_an_unstarted_ending_other_than_a_release_is_refused_and_nothing_moves(ending):
    (a, ta), (b, tb) = claimed(2)
    before = snapshot()
    with pytest.raises(ValueError, match=f"an unstarted claim of {b} is only released"):
        Intent.objects.finish_many(
            [Ending(a, ta, "pending", next_at=at(2)), Ending(b, tb, **ending)], now=at(2)
        )
    assert snapshot() == before


def test_finish_many_adds_one_snooze_for_each_snoozed_ending_only():
    (a, ta), (b, tb), (c, tc), (d, td) = claimed(4)
    endings = [
        Ending(a, ta, "pending", next_at=at(90), error="429 Too Many Requests", snooze=True),
        Ending(b, tb, "pending", next_at=at(60), error="KeyError: 'x'"),
        Ending(c, tc, "cancelled", error="gone for good"),
        Ending(d, "0" * 32, "pending", next_at=at(90), error="stale", snooze=True),
    ]
    assert sorted(Intent.objects.finish_many(endings, now=at(2))) == sorted([a, b, c])
    snoozed, retried, cancelled, untouched = row(a), row(b), row(c), row(d)
    assert (snoozed.state, snoozed.next_at, snoozed.last_error) == (
        "pending",
        at(90),
        "429 Too Many Requests",
    )
    assert (snoozed.attempts, snoozed.snoozes, snoozed.claim_token) == (1, 1, "")
    assert (retried.snoozes, cancelled.snoozes) == (0, 0)
    assert (untouched.state, untouched.claim_token, untouched.snoozes) == ("running", td, 0)

    # A second snooze of the same intent adds one more.
    token = next(i.claim_token for i in Intent.objects.claim_many(4, now=at(90)) if i.id == a)
    ending = Ending(a, token, "pending", next_at=at(120), error="again", snooze=True)
    assert Intent.objects.finish_many([ending], now=at(91)) == [a]
    assert (row(a).attempts, row(a).snoozes, row(a).next_at) == (2, 2, at(120))


def test_finish_many_refuses_bad_endings_before_writing():
    [(id, token)] = claimed(1)
    before = snapshot()
    bad = [
        [Ending(id, token, "completed")],
        [Ending(id, token, "pending", next_at=T0.replace(tzinfo=None))],
        [Ending(id, token, "cancelled"), Ending(id, token, "pending")],
        [Ending("", token, "cancelled")],
    ]
    for endings in bad:
        with pytest.raises((ValueError, TypeError)):
            Intent.objects.finish_many(endings, now=at(1))
    assert snapshot() == before


def test_finish_many_of_a_large_batch_moves_every_claim():
    pairs = claimed(520)
    endings = [Ending(id, token, "cancelled", error="down") for id, token in pairs]
    assert len(Intent.objects.finish_many(endings, now=at(1))) == 520
    assert set(Intent.objects.values_list("state", "last_error")) == {("cancelled", "down")}


def test_finish_many_on_sqlite_is_one_statement_that_finds_each_row_by_its_key(
    vendor, django_assert_num_queries
):
    if vendor != "sqlite":
        pytest.skip("the joined batch is SQLite's (backends/sqlite.py); the others have their own")
    pairs = claimed(3)
    endings = [Ending(id, token, "pending", next_at=at(9), error="later") for id, token in pairs]
    backend = Intent.objects._backend()
    with django_assert_num_queries(1):
        assert len(backend.finish_many(endings, now=at(1))) == 3
    statement = spread(backend.sql.finish_many, rows=3)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + statement.replace("%s", "?"), [None] * 25)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    # Every ending looks its row up by id; a scan of the running rows would grow with them.
    assert "SCAN v" in plan and "(id=?)" in plan and "SCAN django_intents_intent" not in plan
    assert {(r.state, r.next_at, r.last_error, r.claim_token) for r in map(row, dict(pairs))} == {
        ("pending", at(9), "later", "")
    }


def test_finish_many_announces_each_state_after_commit(
    django_capture_on_commit_callbacks, announced
):
    (a, ta), (b, tb) = claimed(2)
    announced.clear()
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        Intent.objects.finish_many(
            [Ending(a, ta, "pending", next_at=at(9)), Ending(b, tb, "cancelled")], now=at(1)
        )
        assert announced == []
    assert announced == [("pending", ["webhook"]), ("cancelled", ["webhook"])]


def test_has_due_sees_a_due_pending_intent_and_not_a_future_one():
    assert Intent.objects.has_due(now=T0) is False
    enqueue(1, next_at=at(10))
    assert Intent.objects.has_due(now=at(9)) is False
    assert Intent.objects.has_due(now=at(10)) is True


def test_has_due_sees_an_expired_lease_but_not_a_live_one():
    claimed(1, lease=10)
    assert Intent.objects.has_due(now=at(9)) is False
    assert Intent.objects.has_due(now=at(10)) is True


def test_has_due_ignores_finished_intents():
    [(id, token)] = claimed(1)
    Intent.objects.complete(id, token, now=at(1))
    assert Intent.objects.has_due(now=at(1_000_000)) is False


def test_has_due_restricts_to_the_given_kinds():
    enqueue(1, kind="push")
    assert Intent.objects.has_due(now=T0, kinds=["webhook"]) is False
    assert Intent.objects.has_due(now=T0, kinds=["push", "webhook"]) is True
    assert Intent.objects.has_due(now=T0, kinds=[]) is False


def test_has_due_agrees_with_claim():
    enqueue(2, next_at=at(5))
    for now in (at(0), at(5)):
        assert Intent.objects.has_due(now=now) is (Intent.objects.due(now).exists())


def test_has_due_is_one_query(django_assert_num_queries, vendor):
    enqueue(1)
    # MariaDB asks its two index ranges separately; the first answers here.
    with django_assert_num_queries(1):
        assert Intent.objects.has_due(now=T0) is True
