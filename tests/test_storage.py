"""Finished intents out of the live rows, by day (issue 38, migration 0018), rows read after.

On PostgreSQL a finished intent moves out of the live partition into its
day's partition; everything ``Intent`` promises holds across the move
(SPEC §15): one row per id, found by ``get``, idempotent, prunable,
redrivable. SQLite and MariaDB keep one table: there the same tests check
that the promises hold without a move (``move_finished`` moves nothing), and
the tests of what only a partition can do (where a row lies, a day dropped
whole, two connections racing a move) say which database they are about.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction

from django_intents.maintenance.retention import move_finished, prune
from django_intents.models import Intent
from django_intents.rules.days import day_of
from django_intents.store import backend_for
from django_intents.store.table import day_partition, live_partition

from .conftest import T0, intents, row, snapshot

pytestmark = pytest.mark.django_db(transaction=True)

TARGET = "https://partner.example/hooks"
DAY = timedelta(days=1)
LABEL = Intent._meta.app_label


@pytest.fixture(autouse=True)
def days_as_the_catalog_has_them() -> None:
    """A test here may reverse migration 0018, which drops every day partition:
    the process's memory of the days it made starts afresh for each test."""
    days = getattr(backend_for(connection, Intent), "days", None)
    if days is not None:
        days.forget()


def finish(event: str, state: str = "completed", *, at: Any = T0) -> str:
    """An intent enqueued, claimed and then completed or cancelled at ``at``."""
    id = Intent.objects.enqueue("webhook", event, TARGET, {"n": event}, now=at - DAY)  # noqa: A001
    claimed = Intent.objects.claim(now=at, kinds=["webhook"])
    assert claimed is not None and claimed.pk == id
    if state == "completed":
        assert Intent.objects.complete(id, claimed.claim_token, now=at)
    else:
        assert Intent.objects.cancel_claim(id, claimed.claim_token, "gone", now=at)
    return id


def moved_all() -> int:
    moved = 0
    while True:
        batch = move_finished()
        moved += batch
        if not batch:
            return moved


def partition_of(id: str) -> str:  # noqa: A002
    """The partition a row lies in (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {Intent._meta.db_table} WHERE id = %s", [id]
        )
        return str(cursor.fetchone()[0])


def rows_of(id: str) -> int:  # noqa: A002
    """How many rows hold ``id``, in every partition."""
    return Intent.objects.filter(pk=id).count()


def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip(f"{connection.vendor} keeps one table: no partition to look at")


def test_a_moved_intent_is_the_same_intent_found_the_same_way():
    done, cancelled = finish("a"), finish("b", "cancelled")
    live = Intent.objects.enqueue("webhook", "c", TARGET, now=T0)
    before = snapshot()
    moved = moved_all()
    assert snapshot() == before  # every column of every row, whichever partition holds it
    assert (row(done).state, row(cancelled).state, row(live).state) == (
        "completed",
        "cancelled",
        "pending",
    )
    assert Intent.objects.filter(state="completed").count() == 1
    assert [i.id for i in Intent.objects.in_state("cancelled")] == [cancelled]
    if connection.vendor == "postgresql":
        assert moved == 2
        assert partition_of(done) == partition_of(cancelled) == day_partition(LABEL, day_of(T0))
        assert partition_of(live) == live_partition(LABEL)
    else:
        assert moved == 0


def test_a_pools_completions_move_their_intents_out_at_once_and_fence_the_late_ones():
    ids = [Intent.objects.enqueue("webhook", f"e{n}", TARGET, now=T0) for n in range(3)]
    claimed = Intent.objects.claim_many(3, now=T0, kinds=["webhook"])
    pairs = [(intent.pk, intent.claim_token) for intent in claimed]
    done = Intent.objects.complete_many(pairs, now=T0 + timedelta(seconds=1))
    assert sorted(done) == sorted(ids)
    after = snapshot()
    assert {
        (r.state, r.attempts, r.claim_token, r.claim_until, r.updated_at) for r in map(row, ids)
    } == {("completed", 1, "", None, T0 + timedelta(seconds=1))}
    if connection.vendor == "postgresql":
        assert {partition_of(id) for id in ids} == {day_partition(LABEL, day_of(T0))}
    # The same results again, as a pool whose lease ran out would send them: fenced.
    assert Intent.objects.complete_many(pairs, now=T0 + timedelta(seconds=2)) == []
    assert snapshot() == after
    assert move_finished() == 0


def test_an_enqueue_of_a_moved_out_id_writes_nothing():
    id = finish("order-1")  # noqa: A001
    moved_all()
    before = snapshot()
    again = Intent.objects.enqueue("webhook", "order-1", TARGET, {"n": "again"}, now=T0 + DAY)
    assert again == id
    assert snapshot() == before
    ids = Intent.objects.enqueue_many(
        [
            {"kind": "webhook", "event_id": "order-1", "target": TARGET},
            {"kind": "webhook", "event_id": "order-2", "target": TARGET},
        ],
        now=T0 + DAY,
    )
    assert ids[0] == id and rows_of(id) == 1 and row(id).state == "completed"
    assert row(ids[1]).state == "pending"


def test_an_intent_written_without_enqueue_keeps_its_id_once_moved_out():
    """A row the ORM wrote has no key until its move writes one."""
    id = Intent.objects.enqueue("webhook", "by-hand", TARGET, now=T0)  # noqa: A001
    Intent.objects.filter(pk=id).update(state="cancelled")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # as a row of the previous release: no key
            cursor.execute("DELETE FROM django_intents_key WHERE id = %s", [id])
    moved_all()
    assert Intent.objects.enqueue("webhook", "by-hand", TARGET, now=T0 + DAY) == id
    assert rows_of(id) == 1 and row(id).state == "cancelled"


@pytest.mark.parametrize("keyed", [True, False], ids=["enqueued", "written-by-the-orm"])
def test_an_enqueue_racing_the_move_of_its_id_waits_and_writes_nothing(keyed: bool):
    """The move holds its transaction open; the enqueue meets it on the key and waits."""
    postgresql_only()
    id = finish("raced")  # noqa: A001
    if not keyed:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM django_intents_key WHERE id = %s", [id])
    table = backend_for(connection, Intent).table
    enqueued: list[str] = []

    def enqueue_meanwhile() -> None:
        try:
            enqueued.append(Intent.objects.enqueue("webhook", "raced", TARGET, now=T0 + DAY))
        finally:
            connections.close_all()

    backend_for(connection, Intent).days.make([day_of(T0)])  # as a move makes its days first
    with transaction.atomic(), table.cursor() as cursor:
        table.execute(cursor, "keep_keys", ids=[id])
        table.execute(cursor, "move_out", ids=[id])
        assert cursor.rowcount == 1
        racer = threading.Thread(target=enqueue_meanwhile)
        racer.start()
        racer.join(1.0)
        # A key written before: the enqueue finds it, looks and sees the row still
        # live. A key the move writes: the enqueue waits for the move to end.
        assert racer.is_alive() is not keyed
    racer.join(10)
    assert enqueued == [id]
    assert rows_of(id) == 1
    assert (row(id).state, partition_of(id)) == ("completed", day_partition(LABEL, day_of(T0)))


def test_a_moved_out_cancelled_intent_is_redriven_back_into_the_live_rows():
    id = finish("redrive-me", "cancelled")  # noqa: A001
    moved_all()
    assert Intent.objects.redrive_many([id], now=T0 + DAY) == [id]
    intent = row(id)
    assert (intent.state, intent.next_at, rows_of(id)) == ("pending", T0 + DAY, 1)
    claimed = Intent.objects.claim(now=T0 + DAY, kinds=["webhook"])
    assert claimed is not None and claimed.pk == id
    if connection.vendor == "postgresql":
        assert partition_of(id) == live_partition(LABEL)


def test_a_moved_out_intent_cannot_be_made_pending_by_hand_and_is_left_as_it_was():
    """Only the redrive moves a row back; a plain update would strand it where no claim looks."""
    postgresql_only()
    id = finish("stranded", "cancelled")  # noqa: A001
    moved_all()
    before = snapshot()
    with pytest.raises(IntegrityError, match="intents_finished_out"), transaction.atomic():
        Intent.objects.filter(pk=id).update(state="pending")
    assert snapshot() == before


@pytest.fixture
def retention(settings: Any) -> Iterator[None]:
    settings.INTENTS = intents(
        RETENTION={"completed": {"delete": 3 * DAY}, "cancelled": {"delete": 3 * DAY}}
    )
    yield


def test_retention_drops_whole_days_and_deletes_the_day_the_window_cuts(retention):
    old = [finish(f"old-{n}", at=T0 - (5 + n) * DAY) for n in range(3)]
    old.append(finish("old-cancelled", "cancelled", at=T0 - 5 * DAY))
    # The window ends at T0 - 3 days, inside that day: the row before it goes,
    # the one after stays.
    edge = T0 - 3 * DAY
    cut = finish("cut", at=edge - timedelta(hours=1))
    kept = finish("kept", at=edge + timedelta(hours=1))
    young = finish("young", at=T0)
    moved_all()
    report = prune(now=T0)
    assert report.deleted == {"completed": 4, "cancelled": 1}
    assert {i.id for i in Intent.objects.all()} == {kept, young}
    assert not Intent.objects.filter(pk__in=[*old, cut]).exists()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_class WHERE relname = ANY (%s)",
                [[day_partition(LABEL, day_of(T0 - (5 + n) * DAY)) for n in range(3)]],
            )
            assert cursor.fetchone() == (0,)  # dropped whole


def test_retention_leaves_no_dead_rows_where_it_drops_days(retention):
    postgresql_only()
    for n in range(20):
        finish(f"old-{n}", at=T0 - 10 * DAY)
    moved_all()
    partition = day_partition(LABEL, day_of(T0 - 10 * DAY))
    assert partition_of(Intent.objects.first().pk) == partition
    prune(now=T0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE %s",
            [f"{LABEL}_d%"],
        )
        assert cursor.fetchone() == (0,)
    assert Intent.objects.count() == 0


def test_a_dry_run_counts_a_dropped_day_once_and_drops_nothing(retention):
    ids = [finish(f"old-{n}", at=T0 - 8 * DAY) for n in range(3)]
    moved_all()
    before = snapshot()
    report = prune(now=T0, dry_run=True)
    assert report.deleted == {"completed": 3, "cancelled": 0}
    assert snapshot() == before and len(before) == len(ids)


def test_an_enqueue_after_its_day_was_dropped_runs_the_event_again(retention):
    id = finish("again", at=T0 - 9 * DAY)  # noqa: A001
    moved_all()
    prune(now=T0)
    assert rows_of(id) == 0
    assert Intent.objects.enqueue("webhook", "again", TARGET, now=T0) == id
    assert row(id).state == "pending"


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Another transaction reading the intents table, as a long report would,
    started by ``reader["start"]()`` and ended by ``reader["end"]()``: no
    partition can be made meanwhile (the lock wait cut to 0.1 s)."""
    from django_intents.store.postgresql import days

    postgresql_only()
    monkeypatch.setattr(days, "LOCK_TIMEOUT", "100ms")
    holding, release = threading.Event(), threading.Event()

    def read_and_wait() -> None:
        try:
            with transaction.atomic():
                list(Intent.objects.all()[:1])
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=read_and_wait)

    def start() -> None:
        thread.start()
        assert holding.wait(10)

    yield {"start": start, "end": release.set}
    release.set()
    if thread.is_alive():
        thread.join(10)


def test_a_day_whose_partition_cannot_be_made_yet_keeps_its_intents_live_until_it_can(reader):
    stuck = finish("stuck", at=T0 - 6 * DAY)
    late_day = T0 + 40 * DAY
    with connection.cursor() as cursor:  # another test may have made them: gone, as never made
        for day in (day_of(T0 - 6 * DAY), day_of(late_day)):
            cursor.execute(f"DROP TABLE IF EXISTS {day_partition(LABEL, day)}")
    backend_for(connection, Intent).days.forget()
    reader["start"]()
    before = snapshot()
    assert move_finished() == 0
    assert partition_of(stuck) == live_partition(LABEL)
    assert snapshot() == before
    # A pool's completions on a day without a partition stay in place, completed.
    late = Intent.objects.enqueue("webhook", "late", TARGET, now=late_day)
    [claimed] = Intent.objects.claim_many(1, now=late_day, kinds=["webhook"])
    assert Intent.objects.complete_many([(late, claimed.claim_token)], now=late_day) == [late]
    assert (row(late).state, partition_of(late)) == ("completed", live_partition(LABEL))
    reader["end"]()  # the report ends
    assert moved_all() == 2
    assert partition_of(stuck) == day_partition(LABEL, day_of(T0 - 6 * DAY))
    assert partition_of(late) == day_partition(LABEL, day_of(late_day))
    assert rows_of(stuck) == rows_of(late) == 1


def test_the_migration_reverses_with_every_row_and_applies_again():
    postgresql_only()
    done, live = finish("done"), Intent.objects.enqueue("webhook", "live", TARGET, now=T0)
    moved_all()
    before = snapshot()
    call_command("migrate", "django_intents", "0017", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relkind FROM pg_class WHERE relname = %s", [Intent._meta.db_table]
            )
            assert cursor.fetchone() == ("r",)  # one plain table again
        assert snapshot() == before
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    assert snapshot() == before
    assert partition_of(done) == partition_of(live) == live_partition(LABEL)
    assert moved_all() == 1
    assert partition_of(done) == day_partition(LABEL, day_of(T0))
