"""``retry_now_many`` and ``cancel_many``: the administrative transitions on a selection.

They are what the admin's actions run: the same guards as ``retry_now`` and
``cancel`` (unfinished intents move, a running claimant is fenced, finished
ones are never touched), one statement per batch of ``INSERT_BATCH`` ids, and the ids moved
come back.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from django_intents.models import Intent
from django_intents.rules.batches import INSERT_BATCH
from django_intents.store import admin as admin_sql

from .conftest import T0, at, enqueue, row, snapshot

pytestmark = pytest.mark.django_db

MANY = ("retry_now_many", "cancel_many")
TO = {"retry_now_many": "pending", "cancel_many": "cancelled"}


def mixed() -> dict[str, str]:
    """A waiting, a running, a completed and a cancelled intent."""
    waiting, running, completed, cancelled = enqueue(4, next_at=at(600))
    Intent.objects.filter(pk__in=[running, completed, cancelled]).update(next_at=T0)
    claims = {i.pk: i for i in Intent.objects.claim_many(3, now=at(1), lease=30)}
    Intent.objects.complete(completed, claims[completed].claim_token, now=at(2))
    Intent.objects.cancel(cancelled, now=at(2))
    return {
        "waiting": waiting,
        "running": running,
        "completed": completed,
        "cancelled": cancelled,
        "token": claims[running].claim_token,
    }


@pytest.mark.parametrize("method", MANY)
def test_unfinished_intents_move_and_finished_ones_are_untouched(method):
    ids = mixed()
    finished = list(
        Intent.objects.filter(pk__in=[ids["completed"], ids["cancelled"]]).order_by("pk").values()
    )
    everything = [ids[k] for k in ("waiting", "running", "completed", "cancelled")]
    moved = getattr(Intent.objects, method)(everything, now=at(5))
    assert sorted(moved) == sorted([ids["waiting"], ids["running"]])
    for pk in moved:
        intent = row(pk)
        assert (intent.state, intent.claim_token, intent.claim_until) == (TO[method], "", None)
        assert intent.updated_at == at(5)
    if method == "retry_now_many":
        assert {row(pk).next_at for pk in moved} == {at(5)}
    after = Intent.objects.filter(pk__in=[ids["completed"], ids["cancelled"]]).order_by("pk")
    assert list(after.values()) == finished


@pytest.mark.parametrize("method", MANY)
def test_the_running_claimant_is_fenced(method):
    ids = mixed()
    getattr(Intent.objects, method)([ids["running"]], now=at(5))
    assert Intent.objects.complete(ids["running"], ids["token"], now=at(6)) is False
    assert Intent.objects.renew(ids["running"], ids["token"], now=at(6)) is False
    assert row(ids["running"]).state == TO[method]


@pytest.mark.parametrize("method", MANY)
def test_a_selection_past_one_batch_moves_every_intent_in_a_statement_per_batch(method):
    ids = Intent.objects.enqueue_many(
        {"kind": "webhook", "event_id": f"e{i}", "target": "t"} for i in range(INSERT_BATCH + 5)
    )
    with CaptureQueriesContext(connection) as queries:
        moved = getattr(Intent.objects, method)(ids)
    assert sorted(moved) == sorted(ids)
    assert Intent.objects.filter(state=TO[method]).count() == INSERT_BATCH + 5
    # Two batches: an UPDATE each (MySQL: a locking SELECT and an UPDATE each), and on
    # PostgreSQL a NOTIFY each for the intents retried now.
    per_batch = {"sqlite": 1, "postgresql": 1, "mysql": 2}[connection.vendor]
    if method == "retry_now_many" and connection.vendor == "postgresql":
        per_batch += 1
    statements = [q for q in queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 2 * per_batch


def test_unknown_and_repeated_ids_are_moved_once_or_not_at_all():
    [a, b] = enqueue(2)
    moved = Intent.objects.cancel_many([a, a, "f" * 64, b], now=at(1))
    assert sorted(moved) == sorted([a, b])


def test_nothing_to_move_runs_no_query():
    with CaptureQueriesContext(connection) as queries:
        assert Intent.objects.retry_now_many([]) == []
    assert len(queries) == 0


@pytest.mark.parametrize(
    "ids",
    [["ok", ""], ["ok", 5], ["ok", "x" * 65], ["ok", "a\x00b"]],
    ids=["empty id", "not a string", "too long", "NUL"],
)
@pytest.mark.parametrize("method", MANY)
def test_a_bad_id_raises_and_moves_nothing(method, ids):
    [good] = enqueue()
    before = snapshot()
    with pytest.raises(ValueError):
        getattr(Intent.objects, method)([good if i == "ok" else i for i in ids], now=at(1))
    assert snapshot() == before


@pytest.mark.parametrize("method", MANY)
def test_a_single_string_is_refused_not_read_as_ids(method):
    [good] = enqueue()
    before = snapshot()
    with pytest.raises(TypeError, match="not a single string"):
        getattr(Intent.objects, method)(good)
    assert snapshot() == before


def test_transitions_are_announced_once_committed_and_not_after_a_rollback(
    django_capture_on_commit_callbacks, announced
):
    ids = enqueue(2)
    before = snapshot()
    with transaction.atomic():
        Intent.objects.cancel_many(ids, now=at(1))
        transaction.set_rollback(True)
    assert (announced, snapshot()) == ([], before)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        Intent.objects.retry_now_many(ids, now=at(1))
        assert announced == []
    assert announced == [("pending", ["webhook", "webhook"])]


@pytest.mark.parametrize("method", MANY)
def test_a_database_error_in_a_later_batch_moves_no_intent_and_announces_nothing(
    method, monkeypatch, announced
):
    """The batches are one transaction: the first batch's rows are not left moved."""
    monkeypatch.setattr(admin_sql, "INSERT_BATCH", 2)
    ids = enqueue(5, next_at=at(600))
    before = snapshot()
    statements = []

    def failing_on_the_second_batch(execute, sql, params, many, context):
        if sql.lstrip().startswith("UPDATE"):
            statements.append(sql)
            if len(statements) == 2:
                raise DatabaseError("the connection dropped")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(failing_on_the_second_batch), pytest.raises(DatabaseError):
        getattr(Intent.objects, method)(ids, now=at(5))
    assert len(statements) == 2  # the first batch had been written
    assert snapshot() == before
    assert announced == []
