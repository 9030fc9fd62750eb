"""The pool in this process: outcomes, batching, renewal, fencing, health, retention, LISTEN.

Handlers here are plain functions handed to ``WorkerPool``; the pool runs in a
thread of its own where a test needs to act while it runs. Real processes and
signals are in test_worker_process.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_intents import Stop, signals
from django_intents.maintenance import retention
from django_intents.managers import IntentManager
from django_intents.models import Intent
from django_intents.store import backend_for
from django_intents.store.clock import server_now
from django_intents.store.wakeups import LISTEN, WATCH
from django_intents.worker import demand, housekeeping
from django_intents.worker.pool import WorkerPool
from django_intents.worker.shutdown import Shutdown
from django_intents.worker.wakeup import CommitWatcher, Listener

from .conftest import external_kinds, intents, row
from .workerutil import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The kinds these pools run. Their handlers are handed to each pool, not
# registered, so enqueue would refuse the kinds without this declaration.
POOL_KINDS = ("p.block", "p.due", "p.fail", "p.fenced", "p.idle", "p.mine", "p.ok")
POOL_KINDS += ("p.other", "p.patient", "p.quick", "p.slow", "p.stop", "p.watch", "f.first", "f.job")
POOL_KINDS += ("p.later", "p.x")


@pytest.fixture(autouse=True)
def pool_kinds() -> Iterator[None]:
    with external_kinds(*POOL_KINDS):
        yield


@pytest.fixture
def finished() -> Iterator[list[dict[str, Any]]]:
    """Every ``attempt_finished`` signal sent while the test runs."""
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append({"sender": sender, **kwargs})

    signals.attempt_finished.connect(receiver, dispatch_uid="test_worker_pool")
    yield sent
    signals.attempt_finished.disconnect(dispatch_uid="test_worker_pool")


class Background:
    """Run a pool in a thread; ``finish()`` stops it and returns its exit status."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.status: int | None = None
        self.thread = threading.Thread(target=self._run, name="test-pool")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.status = self.pool.run()
        finally:
            connections.close_all()

    def finish(self, timeout: float = 15.0) -> int | None:
        self.pool.stop()
        return self.join(timeout)

    def join(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the pool still runs after {timeout:g} s"
        return self.status


@pytest.fixture
def background() -> Iterator[Callable[[WorkerPool], Background]]:
    started: list[Background] = []

    def start(pool: WorkerPool) -> Background:
        started.append(Background(pool))
        return started[-1]

    yield start
    for running in started:
        running.finish()


def pool(handlers: dict[str, Callable[..., Any]], **kwargs: Any) -> WorkerPool:
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("poll_interval", 0.05)
    return WorkerPool(handlers=handlers, handle_signals=False, **kwargs)


def enqueue(kind: str, n: int = 1, payload: Any = None) -> list[str]:
    return [Intent.objects.enqueue(kind, f"event-{i}", "target", payload) for i in range(n)]


def test_drain_records_every_outcome_and_sends_attempt_finished_for_each(background, finished):
    def ok(intent, attempt):
        pass

    def fail(intent, attempt):
        raise KeyError("missing")

    def stop(intent, attempt):
        raise Stop("gone")

    def fenced_then_ok(intent, attempt):
        if intent.attempts == 1:  # an administrator acts while the handler runs
            assert Intent.objects.retry_now(intent.id)

    (ok_id,) = enqueue("p.ok")
    (fail_id,) = enqueue("p.fail")
    (stop_id,) = enqueue("p.stop")
    (fenced_id,) = enqueue("p.fenced")
    # Earlier attempts, so the retry backs off a minute and is not due again during the drain.
    Intent.objects.filter(pk=fail_id).update(attempts=5)
    handlers = {"p.ok": ok, "p.fail": fail, "p.stop": stop, "p.fenced": fenced_then_ok}

    assert background(pool(handlers, drain=True)).join() == 0

    assert row(ok_id).state == Intent.State.COMPLETED
    failed = row(fail_id)
    assert (failed.state, failed.last_error) == (Intent.State.PENDING, "KeyError: 'missing'")
    assert failed.next_at > timezone.now()
    assert (row(stop_id).state, row(stop_id).last_error) == (Intent.State.CANCELLED, "gone")
    assert (row(fenced_id).state, row(fenced_id).attempts) == (Intent.State.COMPLETED, 2)
    outcomes = sorted((signal["kind"], signal["outcome"]) for signal in finished)
    assert outcomes == [
        ("p.fail", "error"),
        ("p.fenced", "fenced"),
        ("p.fenced", "success"),
        ("p.ok", "success"),
        ("p.stop", "stopped"),
    ]
    for signal in finished:
        assert signal["sender"] is Intent
        assert isinstance(signal["intent"], Intent)
        assert signal["intent"].kind == signal["kind"]
        assert isinstance(signal["duration"], float)
        assert signal["duration"] >= 0


def test_claims_the_idle_workers_then_at_most_one_ahead_per_thread_in_batches(
    background, monkeypatch
):
    calls: list[tuple[int, int]] = []
    claim_many = IntentManager.claim_many

    def spy(self, limit, **kwargs):
        claimed = claim_many(self, limit, **kwargs)
        calls.append((limit, len(claimed)))
        return claimed

    def slow(intent, attempt):
        time.sleep(0.05)

    monkeypatch.setattr(IntentManager, "claim_many", spy)
    ids = enqueue("p.slow", 9)

    assert background(pool({"p.slow": slow}, workers=3, drain=True)).join() == 0

    assert all(row(id).state == Intent.State.COMPLETED for id in ids)
    assert calls[0] == (3, 3)
    # Slow handlers queue at most what their threads free within a turn, never more
    # than a thread each (Demand.capacity): on a busy machine a turn is long.
    assert all(limit <= 3 + 3 for limit, _ in calls)
    assert sum(got for _, got in calls) == 9


def test_a_kind_without_a_handler_in_the_pool_is_not_claimed(background):
    (other,) = enqueue("p.other")
    (mine,) = enqueue("p.mine")
    assert background(pool({"p.mine": lambda intent, attempt: None}, drain=True)).join() == 0
    assert row(mine).state == Intent.State.COMPLETED
    assert (row(other).state, row(other).attempts) == (Intent.State.PENDING, 0)


def test_an_idle_pool_claims_only_when_something_is_due_if_claiming_takes_the_write_lock(
    background, monkeypatch
):
    calls: list[int] = []
    claim_many = IntentManager.claim_many

    def spy(self, limit, **kwargs):
        calls.append(limit)
        return claim_many(self, limit, **kwargs)

    monkeypatch.setattr(IntentManager, "claim_many", spy)
    running = background(pool({"p.idle": lambda intent, attempt: None}))
    wait_for(running.pool.healthy, "a running pool")
    time.sleep(0.5)

    if connection.features.has_select_for_update_skip_locked:
        assert calls, "an idle pool claims directly where claims skip locked rows"
    else:
        assert calls == [], "an idle SQLite pool took the write lock with nothing due"
    (id,) = enqueue("p.idle")
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "the intent")
    assert running.finish() == 0


def test_leases_are_renewed_while_a_long_handler_runs(background):
    seen: list[Any] = []

    def slow(intent, attempt):
        attempt.cancelled.wait(2.5)

    (id,) = enqueue("p.slow")
    running = background(pool({"p.slow": slow}, lease=1.0, renew=0.25))
    first = wait_for(lambda: row(id).claim_until if row(id).state == "running" else None, "claim")
    # Past the first lease, another claimer still finds nothing: the lease was renewed.
    time.sleep(1.5)
    seen.append(Intent.objects.claim(kinds=["p.slow"]))
    assert row(id).claim_until > first + timedelta(seconds=1)
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "completion")
    assert running.finish() == 0
    assert seen == [None]
    assert row(id).attempts == 1


def test_a_fenced_renewal_cancels_the_attempt_and_drops_its_result(background, finished):
    noticed = threading.Event()

    def watch(intent, attempt):
        if intent.attempts == 1 and attempt.cancelled.wait(10):
            noticed.set()  # and return normally: a stale success that must not count

    (id,) = enqueue("p.watch")
    running = background(pool({"p.watch": watch}, workers=1, lease=1.2, renew=0.3))
    wait_for(lambda: row(id).state == Intent.State.RUNNING, "the claim")

    assert Intent.objects.cancel(id)

    assert noticed.wait(5), "attempt.cancelled was not set after the claim was fenced"
    wait_for(lambda: finished, "attempt_finished")
    assert running.finish() == 0
    assert [signal["outcome"] for signal in finished] == ["fenced"]
    fresh = row(id)
    assert (fresh.state, fresh.attempts, fresh.claim_token) == (Intent.State.CANCELLED, 1, "")


def test_a_renewal_that_keeps_failing_cancels_the_attempt_once_the_lease_ran_out(
    background, finished, monkeypatch
):
    def broken_renew(self, *args, **kwargs):
        raise OperationalError("renewal refused (test)")

    monkeypatch.setattr(IntentManager, "renew", broken_renew)
    noticed = threading.Event()

    def watch(intent, attempt):
        if intent.attempts == 1 and attempt.cancelled.wait(10):
            noticed.set()  # and return normally: a success that must not be recorded

    (id,) = enqueue("p.watch")
    running = background(pool({"p.watch": watch}, workers=1, lease=1.0, renew=0.2))

    assert noticed.wait(10), "attempt.cancelled was not set when the lease ran out"
    # The first result was discarded and the lease left to expire, so the intent
    # was claimed again (by this pool, the only one) and completed by attempt 2.
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "the rescue")
    assert running.finish() == 0
    assert [signal["outcome"] for signal in finished] == ["fenced", "success"]
    assert [signal["intent"].attempts for signal in finished] == [1, 2]
    assert row(id).attempts == 2


def test_stop_cancels_running_attempts_and_a_handler_giving_up_is_released_at_once(background):
    started = threading.Event()

    def patient(intent, attempt):
        started.set()
        attempt.cancelled.wait(30)
        attempt.check()

    (id,) = enqueue("p.patient")
    running = background(pool({"p.patient": patient}, grace=30.0))
    # Running, not only claimed: a claim whose handler has not started is released
    # at stop with its attempt undone (on a busy machine the thread starts late).
    assert started.wait(10)
    stopped_at = server_now()

    assert running.finish(timeout=10) == 0

    fresh = row(id)
    assert (fresh.state, fresh.claim_token, fresh.attempts) == (Intent.State.PENDING, "", 1)
    assert stopped_at <= fresh.next_at <= timezone.now()


def test_healthy_while_the_loop_runs_and_not_after_it_stopped(background):
    subject = pool({"p.idle": lambda intent, attempt: None})
    assert not subject.healthy()
    running = background(subject)
    wait_for(subject.healthy, "a healthy pool")
    assert running.finish() == 0
    assert not subject.healthy()


def test_healthy_turns_false_when_the_database_is_not_reached_lately(background, monkeypatch):
    subject = pool({"p.due": lambda intent, attempt: None}, db_error_timeout=60.0)
    running = background(subject)
    wait_for(subject.healthy, "a healthy pool")

    def unreachable(self, *args, **kwargs):
        raise OperationalError("database down (test)")

    monkeypatch.setattr(IntentManager, "claim_many", unreachable)
    (id,) = enqueue("p.due")  # so that the pool does try to claim
    monkeypatch.setattr(subject._liveness, "window", 0.3)
    wait_for(lambda: not subject.healthy(), "an unhealthy pool", timeout=5)
    monkeypatch.undo()
    wait_for(subject.healthy, "the pool healthy again", timeout=10)
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "the intent, after the outage")
    assert running.finish() == 0
    assert row(id).attempts == 1


def test_database_errors_past_the_timeout_end_the_run_with_status_1(
    background, monkeypatch, caplog
):
    def unreachable(self, *args, **kwargs):
        raise OperationalError("database down (test)")

    monkeypatch.setattr(IntentManager, "claim_many", unreachable)
    (id,) = enqueue("p.due")  # so that the pool does try to claim
    running = background(pool({"p.due": lambda intent, attempt: None}, db_error_timeout=0.5))

    assert running.join(15) == 1
    assert (row(id).state, row(id).attempts) == (Intent.State.PENDING, 0)

    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert len(errors) == 1
    assert "database unavailable" in errors[0].getMessage()
    assert "OperationalError: database down (test)" in errors[0].getMessage()


def test_a_drain_whose_results_could_not_be_recorded_exits_1_saying_how_many(
    background, monkeypatch, caplog
):
    def unreachable(self, *args, **kwargs):
        raise OperationalError("database down (test)")

    def fail(intent, attempt):
        raise RuntimeError("partner down")

    monkeypatch.setattr(IntentManager, "finish_many", unreachable)
    (id,) = enqueue("p.fail")
    running = background(pool({"p.fail": fail}, drain=True, db_error_timeout=0.5))

    assert running.join(20) == 1
    intent = row(id)
    # Not recorded: still running under the lease it had, for another pool to rescue.
    assert (intent.state, intent.attempts, intent.last_error) == (Intent.State.RUNNING, 1, "")
    errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert any(
        "1 attempt result(s) could not be recorded and 1 intent(s) stay running" in m
        for m in errors
    ), errors


@pytest.fixture
def fake_retention(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(retention, "prune", lambda now=None, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(housekeeping, "PRUNE_INTERVAL", 0.1)
    return calls


@override_settings(INTENTS=intents(RETENTION={"completed": {"delete": timedelta(days=7)}}))
def test_with_retention_set_the_pool_prunes_one_small_batch_at_a_time(background, fake_retention):
    running = background(pool({"p.idle": lambda intent, attempt: None}))
    wait_for(lambda: len(fake_retention) >= 2, "two prune calls")
    assert running.finish() == 0
    assert fake_retention[0] == {
        "batch_size": housekeeping.PRUNE_BATCH_SIZE,
        "max_batches": 1,
        "using": "default",
    }


def test_without_retention_the_pool_never_prunes(background, fake_retention):
    running = background(pool({"p.idle": lambda intent, attempt: None}))
    wait_for(running.pool.healthy, "a running pool")
    time.sleep(0.5)
    assert running.finish() == 0
    assert fake_retention == []


def test_listen_is_used_exactly_on_postgresql():
    wakeup = backend_for(connection, Intent).wakeup()
    assert (wakeup.how == LISTEN) is (connection.vendor == "postgresql")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the commit watch is SQLite's")
def test_a_commit_of_another_connection_wakes_the_commit_watcher():
    assert backend_for(connection, Intent).wakeup().how == WATCH  # a file, not :memory:
    woken = threading.Event()
    watcher = CommitWatcher(using="default", wake=woken.set)
    watcher.start()
    try:
        time.sleep(0.1)  # its first look
        assert not woken.is_set()
        enqueue("p.mine")
        assert woken.wait(5), "the commit went unseen"
    finally:
        watcher.stop()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_a_stopped_listener_is_woken_instead_of_waiting_out_its_wait():
    woken = threading.Event()
    listener = Listener(using="default", kinds={"p.mine"}, wake=woken.set)
    listener.start()
    assert listener.listening.wait(10), "the listener did not connect"
    connection.ensure_connection()  # the pool's own connection, open as in a pool
    woken.clear()
    listener.stop(timeout=Listener.WAIT / 2)
    assert not listener._thread.is_alive(), "the listener waited out its wait"
    assert not woken.is_set()  # the stop's NOTIFY wakes no pool


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's")
def test_listener_wakes_on_commit_for_its_own_kinds_only():
    woken = threading.Event()
    listener = Listener(using="default", kinds={"p.mine"}, wake=woken.set)
    listener.start()
    try:
        assert listener.listening.wait(10), "the listener did not connect"
        time.sleep(0.2)
        woken.clear()  # the wake-up it gives when it (re)connects

        enqueue("p.other")
        assert not woken.wait(0.5), "woken by another kind"
        with transaction.atomic():
            enqueue("p.mine")
            assert not woken.wait(0.5), "woken before the enqueue committed"
        assert woken.wait(5), "not woken after the enqueue committed"

        woken.clear()
        claimed = Intent.objects.claim(kinds=["p.mine"])
        assert Intent.objects.release(claimed.id, claimed.claim_token)
        assert woken.wait(5), "not woken by a release"
    finally:
        listener.stop()


def test_the_command_drains_in_process_as_the_docs_suggest_for_tests(monkeypatch):
    logger = logging.getLogger("django_intents")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    (id,) = enqueue("test.ok")

    call_command("run_intent_workers", "--drain", "--kinds", "test.ok")

    assert row(id).state == Intent.State.COMPLETED


def test_throughput_is_logged_periodically(background, caplog):
    caplog.set_level(logging.INFO, logger="django_intents")
    ids = enqueue("p.ok", 3)
    running = background(pool({"p.ok": lambda intent, attempt: None}, report_interval=0.2))

    def reported() -> list[re.Match[str]]:
        pattern = r"attempt\(s\) finished in the last .* (\d+) completed, (\d+) retried"
        return [m for r in caplog.records if (m := re.search(pattern, r.getMessage()))]

    wait_for(lambda: sum(int(m[1]) for m in reported()) >= 3, "throughput lines counting them")
    assert running.finish() == 0
    assert all(row(id).state == Intent.State.COMPLETED for id in ids)
    assert sum(int(m[1]) for m in reported()) == 3
    assert sum(int(m[2]) for m in reported()) == 0


# -- claiming ahead while handlers are quick -----------------------------------------------


def running() -> int:
    return Intent.objects.filter(state=Intent.State.RUNNING).count()


def enqueue_at(kind: str, n: int, seconds_ago: float) -> list[str]:
    next_at = timezone.now() - timedelta(seconds=seconds_ago)
    return [
        Intent.objects.enqueue(kind, f"{kind}-{i}", "target", next_at=next_at) for i in range(n)
    ]


def test_a_pool_whose_threads_stall_holds_one_queued_claim_per_worker(background):
    gate = threading.Event()
    blocked: list[str] = []

    def block(intent, attempt):
        blocked.append(intent.event_id)
        gate.wait(10)

    enqueue_at("p.quick", 6, seconds_ago=60)  # claimed first; teach the pool they are quick
    slow_ids = enqueue_at("p.block", 3, seconds_ago=30)
    job = background(pool({"p.quick": lambda intent, attempt: None, "p.block": block}, workers=1))
    wait_for(lambda: blocked, "the first blocking handler")
    wait_for(lambda: running() == 2, "a second claim queued behind the running one")
    time.sleep(0.3)  # a few more loop turns: still no more than two per worker
    assert running() == 2
    assert len(blocked) == 1
    gate.set()
    wait_for(lambda: all(row(id).state == Intent.State.COMPLETED for id in slow_ids), "the rest")
    assert job.finish() == 0


def test_a_pool_of_slow_handlers_holds_one_claim_per_worker(background):
    gate = threading.Event()
    blocked: list[str] = []

    def slow(intent, attempt):
        time.sleep(0.05)  # above CLAIM_AHEAD_BELOW

    def block(intent, attempt):
        blocked.append(intent.event_id)
        gate.wait(10)

    assert demand.CLAIM_AHEAD_BELOW < 0.05
    enqueue_at("p.slow", 4, seconds_ago=60)
    enqueue_at("p.block", 3, seconds_ago=30)
    job = background(pool({"p.slow": slow, "p.block": block}, workers=1))
    wait_for(lambda: blocked, "the first blocking handler")
    time.sleep(0.5)  # ten polls at 0.05 s: none of them may claim ahead
    assert running() == 1
    gate.set()
    wait_for(lambda: len(blocked) == 3, "every blocking handler")
    assert job.finish() == 0


def test_a_stop_releases_a_queued_claim_without_running_it(background):
    started: list[str] = []

    def block(intent, attempt):
        started.append(intent.event_id)
        attempt.cancelled.wait(10)  # until the stop

    enqueue_at("p.quick", 6, seconds_ago=60)
    first, second = enqueue_at("p.block", 2, seconds_ago=30)
    job = background(pool({"p.quick": lambda intent, attempt: None, "p.block": block}, workers=1))
    wait_for(
        lambda: started and row(second).state == Intent.State.RUNNING, "one running, one queued"
    )
    assert job.finish() == 0
    assert started == ["p.block-0"]
    queued = row(second)
    # Its claim counted an attempt; released unstarted, it takes it back.
    assert (queued.state, queued.claim_token, queued.attempts) == (Intent.State.PENDING, "", 0)
    assert queued.next_at <= timezone.now()
    # The one that ran returned normally once cancelled: a success like any other.
    assert row(first).state == Intent.State.COMPLETED


def test_a_queued_claim_lost_while_it_waited_is_not_run(background, finished, caplog):
    caplog.set_level(logging.WARNING, logger="django_intents")
    gate = threading.Event()
    started: list[str] = []

    def block(intent, attempt):
        started.append(intent.event_id)
        gate.wait(10)

    enqueue_at("p.quick", 6, seconds_ago=60)
    first, second = enqueue_at("p.block", 2, seconds_ago=30)
    handlers = {"p.quick": lambda intent, attempt: None, "p.block": block}
    job = background(pool(handlers, workers=1, lease=1.5, renew=0.3))
    wait_for(lambda: started and running() == 2, "one claim running, one queued")
    assert Intent.objects.cancel(second)  # an operator cancels the queued one
    wait_for(
        lambda: f"{second[:12]} (attempt 1): claim lost" in caplog.text,
        "the loop's next renewal to find the queued claim gone",
    )
    gate.set()

    def fenced() -> bool:
        return any(s["outcome"] == "fenced" for s in finished if s["kind"] == "p.block")

    # The worker thread hands the lost claim back after the first's result:
    # wait for both, or a stop could come between them.
    wait_for(
        lambda: row(first).state == Intent.State.COMPLETED and fenced(),
        "the first to complete and the second to be handed back unrun",
    )
    assert job.finish() == 0
    assert started == ["p.block-0"]
    assert row(second).state == Intent.State.CANCELLED
    outcomes = [(s["intent"].event_id, s["outcome"]) for s in finished if s["kind"] == "p.block"]
    assert sorted(outcomes) == [("p.block-0", "success"), ("p.block-1", "fenced")]


@pytest.mark.parametrize("awaited", [False, True], ids=["thread", "event-loop"])
def test_a_handler_returning_as_the_grace_ends_is_recorded_not_left_to_its_lease(
    background, finished, monkeypatch, awaited
):
    """Its handler returns after the loop's last look at the results, just before the
    release of what still runs: the release passes it by, so its result must be
    recorded, or it would run again once its lease ran out."""
    gate = threading.Event()

    started = threading.Event()

    def deaf(intent, attempt):
        started.set()
        gate.wait(10)  # deaf to attempt.cancelled: it returns when the test says

    async def deaf_async(intent, attempt):
        started.set()
        while not gate.is_set():
            await asyncio.sleep(0.005)

    late = deaf_async if awaited else deaf
    (id,) = enqueue("p.slow")
    release = Shutdown.release_unfinished

    def returning_first(self, leases, collect):
        gate.set()
        wait_for(lambda: all(c.outcome for c in leases.claims()), "the handler to return")
        release(self, leases, collect)

    monkeypatch.setattr(Shutdown, "release_unfinished", returning_first)
    job = background(pool({"p.slow": late}, grace=0.2, lease=30.0))
    started.wait(10)  # running, not only claimed: a claim not started is released at stop
    wait_for(lambda: row(id).state == Intent.State.RUNNING, "the claim")
    assert job.finish() == 0
    fresh = row(id)
    assert (fresh.state, fresh.claim_token, fresh.attempts) == (Intent.State.COMPLETED, "", 1)
    assert [(s["intent"].id, s["outcome"]) for s in finished] == [(id, "success")]


# -- the claim floor (django_intents/floor.py) ---------------------------------------------


def test_a_drain_runs_an_intent_written_below_its_floor_before_it_ends(background):
    ran: list[str] = []

    def first(intent, attempt):
        ran.append(intent.event_id)
        # Back-dated, written after the pool's floor was set above it.
        Intent.objects.enqueue(
            "f.job", "backdated", "t", next_at=timezone.now() - timedelta(hours=1)
        )

    def job(intent, attempt):
        ran.append(intent.event_id)

    Intent.objects.enqueue("f.first", "first", "t")
    assert background(pool({"f.first": first, "f.job": job}, workers=1, drain=True)).join() == 0
    assert ran == ["first", "backdated"]
    assert set(Intent.objects.values_list("state", flat=True)) == {Intent.State.COMPLETED}


def test_a_pool_rescues_an_expired_lease_on_an_intent_older_than_its_floor(background):
    ran: list[Any] = []
    long_ago = timezone.now() - timedelta(hours=1)
    id = Intent.objects.enqueue("f.job", "stale", "t", next_at=long_ago)
    # A worker that died holding it: its lease runs out 1.5 s from now.
    assert Intent.objects.claim(lease=1.5).id == id
    job = background(pool({"f.job": lambda intent, attempt: ran.append(timezone.now())}))
    expires = row(id).claim_until
    wait_for(lambda: row(id).state == Intent.State.COMPLETED, "the rescue", timeout=10)
    assert job.finish() == 0
    assert len(ran) == 1
    # Found by a full scan, at most FULL_SCAN_EVERY (1 s) plus a poll after expiry.
    assert ran[0] - expires < timedelta(seconds=3)
    assert row(id).attempts == 2


def test_until_empty_runs_an_intent_scheduled_after_the_start_then_ends(background):
    ran = []
    later = Intent.objects.enqueue(
        "p.later", "e", "t", next_at=timezone.now() + timedelta(seconds=0.5)
    )
    (other,) = enqueue("p.other")  # no handler in this pool: not waited for

    status = background(
        pool({"p.later": lambda intent, attempt: ran.append(intent.id)}, until_empty=True)
    ).join()

    assert (status, ran) == (0, [later])
    assert row(later).state == Intent.State.COMPLETED
    assert (row(other).state, row(other).attempts) == (Intent.State.PENDING, 0)


def test_a_drain_ends_while_an_intent_is_scheduled_for_later(background):
    later = Intent.objects.enqueue("p.later", "e", "t", next_at=timezone.now() + timedelta(hours=1))
    assert background(pool({"p.later": lambda intent, attempt: None}, drain=True)).join() == 0
    assert (row(later).state, row(later).attempts) == (Intent.State.PENDING, 0)


def test_until_empty_past_its_timeout_returns_1_and_leaves_the_intent_pending(background, caplog):
    later = Intent.objects.enqueue("p.later", "e", "t", next_at=timezone.now() + timedelta(hours=1))
    handlers = {"p.later": lambda intent, attempt: None}
    started = time.monotonic()

    with caplog.at_level(logging.INFO, logger="django_intents"):
        status = background(pool(handlers, until_empty=True, timeout=0.5)).join()

    assert status == 1
    assert time.monotonic() - started < 10
    assert (row(later).state, row(later).attempts) == (Intent.State.PENDING, 0)
    assert (
        "timed out after 0.5 s with 1 intent(s) of the pool's kinds still pending or running: "
        "p.later (1 pending, 0 running)"
    ) in caplog.text


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        pool({"p.x": lambda intent, attempt: None}, until_empty=True, timeout=timeout)


def test_a_timeout_without_drain_or_until_empty_is_refused():
    with pytest.raises(ValueError, match="timeout bounds a drain"):
        pool({"p.x": lambda intent, attempt: None}, timeout=5)


def test_demand_queues_what_threads_free_within_a_turn_and_no_more_than_a_thread_each():
    queue = demand.Demand(100)
    assert queue.capacity() == 100  # nothing learned yet: one claim per thread
    queue.learn(0.001)
    assert queue.capacity() == 200  # quick handlers: two each
    slow = demand.Demand(100)
    slow.learn(0.1)
    for _ in range(50):
        slow.turned(0.02)
    assert slow.capacity() == 119  # ~100 x 20 ms / 100 ms freed per turn (average just below)
    slow.learn(60.0)
    for _ in range(50):
        slow.learn(60.0)
    assert slow.capacity() == 100  # long handlers free none per turn: nothing queued
