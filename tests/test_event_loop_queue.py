"""The event loop's queue (``eventloop.py``, ``demand.py``): async handlers' claims
wait there for a slot and start the moment one frees; the pool claims ahead for
it, gives it back when the handlers stall or the pool stops, and for kinds with
``LIMITS`` only what frees during a turn, never beyond their caps."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_intents.attempt import Attempt
from django_intents.models import Intent
from django_intents.worker import demand
from django_intents.worker.demand import Demand, claim_groups
from django_intents.worker.eventloop import EventLoop
from django_intents.worker.execution import Claim

from .conftest import external_kinds, intents, row
from .test_local_queue import Clock
from .test_worker_pool import Background, background, enqueue_at, pool, running  # noqa: F401
from .workerutil import wait_for


def returning(slots: Demand, clock: Clock, *, per_second: int, seconds: float) -> None:
    """Handlers of 50 ms returning at ``per_second``, the pool turning every 10 ms."""
    owed = 0.0
    for _ in range(int(seconds * 100)):
        clock.now += 0.01
        owed += per_second / 100
        while owed >= 1:
            slots.learn(0.05)
            owed -= 1
        slots.turned(0.002)


def test_the_event_loop_queues_what_its_slots_free_in_a_tenth_of_a_second():
    clock = Clock()
    slots = Demand(64, awaited=True, clock=clock)
    assert slots.capacity() == 64  # nothing returned yet: no queue
    returning(slots, clock, per_second=200, seconds=2)
    assert 19 <= slots.capacity() - 64 <= 20  # 200/s x 0.1 s, however long a handler takes


def test_the_event_loop_queues_at_most_as_many_claims_as_it_has_slots():
    clock = Clock()
    slots = Demand(64, awaited=True, clock=clock)
    returning(slots, clock, per_second=5000, seconds=2)
    assert slots.capacity() == 128


def test_a_stalled_event_loop_gets_no_queue_and_wakes_the_pool_to_give_it_back():
    clock = Clock()
    slots = Demand(64, awaited=True, clock=clock)
    returning(slots, clock, per_second=1000, seconds=2)
    assert slots.wake_at(0) == float("inf")  # nothing waits: nothing to give back
    assert slots.wake_at(1) == clock.now + demand.STALL_AFTER
    clock.now += demand.STALL_AFTER
    assert slots.capacity() == 64


def test_kinds_with_limits_are_claimed_ahead_only_for_what_frees_during_a_turn():
    async def deliver(intent: Any, attempt: Any) -> None:
        pass

    handlers = {"relay": deliver, "other": deliver, "sync": lambda i, a: None}
    for limited, ahead in (({"relay"}, False), ({"sync"}, True), (set(), True)):
        threads, loop = claim_groups(handlers, 2, 8, 30.0, limited)
        assert (threads.kinds, loop.kinds) == (["sync"], ["other", "relay"])
        clock = Clock()
        loop.demand = Demand(8, awaited=True, ahead=ahead, clock=clock)
        assert loop.demand._ahead is not any(k in limited for k in loop.kinds)
        returning(loop.demand, clock, per_second=1000, seconds=1)
        # 1000/s: a tenth of a second's worth (capped at the 8 slots), or for
        # limited kinds what returns in one turn of 2 ms (just under 2: 1 or 2).
        ahead_by = loop.demand.capacity() - 8
        assert (ahead_by == 8) if ahead else (1 <= ahead_by <= 2), limited


def test_kinds_with_limits_get_the_full_queue_while_their_claims_hold_nothing_back():
    clock = Clock()
    slots = Demand(64, awaited=True, ahead=False, clock=clock)
    returning(slots, clock, per_second=1000, seconds=1)
    assert 1 <= slots.capacity() - 64 <= 2  # a turn's worth
    slots.claimed(bound=False)  # a claim found room for all it asked
    assert slots.capacity() - 64 == 64  # a tenth of a second at 1000/s, capped at the slots
    slots.claimed(bound=True)  # a limit may have held an intent back
    assert 1 <= slots.capacity() - 64 <= 2


# -- the event loop itself, without a database ---------------------------------


class Gates:
    """Async handlers that each wait for their own gate; ``started`` in order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, threading.Event] = {}

    async def __call__(self, intent: Intent, attempt: Attempt) -> None:
        self.started.append(intent.id)
        gate = self.gates.setdefault(intent.id, threading.Event())
        while not gate.is_set():
            await asyncio.sleep(0.005)

    def open(self, name: str) -> None:
        self.gates.setdefault(name, threading.Event()).set()


def claim(gates: Gates, name: str, priority: int = 0) -> Claim:
    intent = Intent(id=name, kind="k", event_id=name, target="t", priority=priority)
    claim = Claim(intent=intent, attempt=Attempt(intent), handler=gates, awaited=True)
    claim.lease_end = time.monotonic() + 60
    return claim


@pytest.fixture
def loop_of_two() -> Iterator[tuple[EventLoop, Gates, queue.SimpleQueue[Claim]]]:
    finished: queue.SimpleQueue[Claim] = queue.SimpleQueue()
    loop = EventLoop(finished, lambda: None, 2)
    loop.start()
    yield loop, Gates(), finished
    loop.stop()


def test_claims_beyond_the_slots_wait_and_start_as_soon_as_one_frees(loop_of_two):
    loop, gates, finished = loop_of_two
    loop.submit([claim(gates, name) for name in "abcd"])
    wait_for(lambda: len(gates.started) == 2, "two slots taken")
    time.sleep(0.05)
    assert (gates.started, loop.qsize()) == (["a", "b"], 2)
    gates.open("a")
    wait_for(lambda: gates.started == ["a", "b", "c"], "c in a's slot")
    assert finished.get(timeout=5).intent.id == "a"
    for name in "bcd":
        gates.open(name)
    wait_for(lambda: finished.qsize() == 3, "every handler handed back")
    assert (gates.started, loop.qsize()) == (["a", "b", "c", "d"], 0)


def test_a_claim_of_higher_priority_waits_ahead_of_those_already_waiting(loop_of_two):
    loop, gates, _ = loop_of_two
    loop.submit([claim(gates, "a"), claim(gates, "b"), claim(gates, "c"), claim(gates, "d")])
    wait_for(lambda: len(gates.started) == 2, "two slots taken")
    loop.submit([claim(gates, "urgent", priority=50), claim(gates, "e")])
    for name in "abc":
        gates.open(name)
    wait_for(lambda: len(gates.started) == 5, "three more started")
    assert gates.started == ["a", "b", "urgent", "c", "d"]


def test_take_hands_back_the_waiting_claims_last_queued_first_and_none_starts(loop_of_two):
    loop, gates, finished = loop_of_two
    loop.submit([claim(gates, name) for name in "abcde"])
    wait_for(lambda: len(gates.started) == 2, "two slots taken")
    assert [c.intent.id for c in loop.take(2)] == ["e", "d"]
    assert [c.intent.id for c in loop.take(10)] == ["c"]
    gates.open("a")
    gates.open("b")
    wait_for(lambda: finished.qsize() == 2, "a and b handed back")
    time.sleep(0.05)
    assert gates.started == ["a", "b"]


# -- in a pool, on the database ---------------------------------------------------


@pytest.fixture(autouse=True)
def loop_kinds() -> Iterator[None]:
    with external_kinds("aq.quick", "aq.block"):
        yield


async def quick(intent: Intent, attempt: Attempt) -> None:
    await asyncio.sleep(0)


@pytest.mark.django_db(transaction=True)
def test_a_pool_claims_ahead_for_its_event_loop(background):  # noqa: F811
    sizes: list[int] = []
    job = pool({"aq.quick": quick}, concurrency=4, drain=True)
    claim_many = job._manager.claim_many

    def recording(limit: int, **kwargs: Any) -> Any:
        sizes.append(limit)
        return claim_many(limit, **kwargs)

    job._manager.claim_many = recording  # type: ignore[method-assign]
    ids = enqueue_at("aq.quick", 300, seconds_ago=1)
    assert background(job).join() == 0
    assert max(sizes) > 4  # more than the slots: some waited on the event loop
    assert {(row(id).state, row(id).attempts) for id in ids} == {(Intent.State.COMPLETED, 1)}


@pytest.mark.django_db(transaction=True)
def test_a_stalled_event_loop_gives_its_queue_back_unstarted(background):  # noqa: F811
    gate = threading.Event()
    started: list[str] = []

    async def block(intent: Intent, attempt: Attempt) -> None:
        started.append(intent.event_id)
        while not gate.is_set():
            await asyncio.sleep(0.005)

    # Quick handlers first teach the pool to claim ahead; behind them, blocking
    # ones take both slots and stall the loop.
    enqueue_at("aq.quick", 200, seconds_ago=60)
    blocked = enqueue_at("aq.block", 30, seconds_ago=30)
    began = timezone.now()
    job = background(pool({"aq.quick": quick, "aq.block": block}, concurrency=2))
    wait_for(lambda: len(started) == 2, "both slots blocked")
    wait_for(lambda: running() <= 2, "the waiting claims given back", timeout=5)
    pending = [row(id) for id in blocked if row(id).state == Intent.State.PENDING]
    assert len(pending) == 28
    assert {(r.claim_token, r.attempts) for r in pending} == {("", 0)}  # attempts taken back
    given_back = [r for r in pending if r.next_at >= began]  # released due now
    assert given_back, "none was claimed ahead: nothing to give back"
    until = time.monotonic() + 3 * demand.STALL_AFTER
    while time.monotonic() < until:  # still stalled: nothing is claimed ahead again
        assert running() <= 2
        assert len(started) == 2
        time.sleep(0.02)
    gate.set()
    wait_for(
        lambda: all(row(id).state == Intent.State.COMPLETED for id in blocked), "every blocked one"
    )
    assert job.finish() == 0
    assert {row(id).attempts for id in blocked} == {1}  # a give-back costs no attempt


@pytest.mark.django_db(transaction=True)
def test_a_stop_releases_the_claims_waiting_on_the_event_loop(background):  # noqa: F811
    gate = threading.Event()
    started: list[str] = []

    async def block(intent: Intent, attempt: Attempt) -> None:
        started.append(intent.event_id)
        while not gate.is_set():
            await asyncio.sleep(0.005)

    enqueue_at("aq.quick", 200, seconds_ago=60)
    blocked = enqueue_at("aq.block", 30, seconds_ago=30)
    began = timezone.now()
    job = background(pool({"aq.quick": quick, "aq.block": block}, concurrency=2, grace=5))
    wait_for(lambda: len(started) == 2, "both slots blocked")
    job.pool.stop()
    wait_for(lambda: running() <= 2, "the waiting claims released")
    gate.set()
    assert job.finish() == 0
    rows = [row(id) for id in blocked]
    ran = [r for r in rows if r.state == Intent.State.COMPLETED]
    assert sorted(r.event_id for r in ran) == sorted(started)
    rest = [r for r in rows if r.state != Intent.State.COMPLETED]
    assert {(r.state, r.claim_token, r.attempts) for r in rest} == {(Intent.State.PENDING, "", 0)}
    assert [r for r in rest if r.next_at >= began], "none was claimed ahead: nothing to release"
    assert len(ran) + len(rest) == 30


@pytest.mark.django_db(transaction=True)
def test_a_limited_async_kind_claimed_ahead_never_runs_beyond_its_per_target_cap(
    background,  # noqa: F811
):
    running_now: dict[str, int] = {}
    peaks: dict[str, int] = {}
    lock = threading.Lock()

    async def deliver(intent: Intent, attempt: Attempt) -> None:
        with lock:
            running_now[intent.target] = running_now.get(intent.target, 0) + 1
            peaks[intent.target] = max(peaks.get(intent.target, 0), running_now[intent.target])
        await asyncio.sleep(0.005)
        with lock:
            running_now[intent.target] -= 1

    ids = [
        Intent.objects.enqueue("aq.quick", f"limited-{i}", f"t{i % 3}", next_at=timezone.now())
        for i in range(90)
    ]
    table_peaks: list[int] = []
    declared = [*intents().get("EXTERNAL_KINDS", ()), "aq.quick", "aq.block"]
    limited = intents(EXTERNAL_KINDS=declared, LIMITS={"aq.quick": {"per_target": 2}})
    with override_settings(INTENTS=limited):
        job = background(pool({"aq.quick": deliver}, concurrency=8, drain=True))
        until = time.monotonic() + 30
        while job.thread.is_alive() and time.monotonic() < until:  # the table, sampled
            per_target = Intent.objects.filter(state="running").values_list("target", flat=True)
            table_peaks.append(max(Counter(per_target).values(), default=0))
            time.sleep(0.01)
        assert job.join() == 0
    assert max(peaks.values()) <= 2 and max(table_peaks) <= 2, (peaks, table_peaks)
    assert {(row(id).state, row(id).attempts) for id in ids} == {(Intent.State.COMPLETED, 1)}


@pytest.mark.django_db(transaction=True)
def test_a_rated_kind_beside_others_leaves_them_their_queue_and_takes_what_starts_now(
    background,  # noqa: F811
):
    """The async group holds a rated kind and an unrated one: the unrated one is still
    claimed ahead of the slots, the rated one never more per claim than ``paced``."""
    asks: list[tuple[int, int | None, int]] = []
    declared = [*intents().get("EXTERNAL_KINDS", ()), "aq.quick", "aq.paced"]
    limits = {"aq.paced": {"rate": "4/1s"}}
    with override_settings(INTENTS=intents(EXTERNAL_KINDS=declared, LIMITS=limits)):
        job = pool({"aq.quick": quick, "aq.paced": quick}, concurrency=4, drain=True)
        claim_many = job._manager.claim_many

        def recording(limit: int, **kwargs: Any) -> Any:
            got = claim_many(limit, **kwargs)
            asks.append((limit, kwargs["paced"], sum(i.kind == "aq.paced" for i in got)))
            return got

        job._manager.claim_many = recording  # type: ignore[method-assign]
        paced = enqueue_at("aq.paced", 8, seconds_ago=2)
        free = enqueue_at("aq.quick", 300, seconds_ago=1)
        assert background(job).join() == 0
    assert max(limit for limit, _, _ in asks) > 4  # the unrated kind queued ahead
    assert all(took <= cap for _, cap, took in asks if cap is not None), asks
    assert all(cap is not None for _, cap, _ in asks)
    rows = Intent.objects.filter(id__in=paced + free)
    assert {(r.state, r.attempts) for r in rows} == {("completed", 1)}
    # Eight starts of one target at 4 a second span a window (each completion trails
    # its claim by a few milliseconds, not always the same few).
    ends = sorted(r.updated_at for r in rows if r.kind == "aq.paced")
    assert (ends[-1] - ends[0]).total_seconds() >= 0.9
