"""The pool's local queue (``demand.py``): claimed ahead for quick handlers, given back
when the threads stall, highest priority first."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_intents.attempt import Attempt
from django_intents.models import Intent
from django_intents.rules.limits import paced_kinds
from django_intents.rules.limits import parse as parse_limits
from django_intents.worker import demand
from django_intents.worker.demand import Demand, claim_groups
from django_intents.worker.execution import Claim
from django_intents.worker.queues import LocalQueue

from .conftest import external_kinds, row
from .test_worker_pool import Background, background, enqueue_at, pool, running  # noqa: F401
from .workerutil import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def finishing(queue: Demand, clock: Clock, *, per_second: int, seconds: float) -> None:
    """Handlers of 1 ms returning at ``per_second``, the pool turning every 10 ms."""
    owed = 0.0
    for _ in range(int(seconds * 100)):
        clock.now += 0.01
        owed += per_second / 100
        while owed >= 1:
            queue.learn(0.001)
            owed -= 1
        queue.turned(0.002)


def test_quick_handlers_queue_a_tenth_of_a_second_of_what_the_threads_finish():
    clock = Clock()
    queue = Demand(8, clock=clock)
    finishing(queue, clock, per_second=2000, seconds=2)
    assert 190 <= queue.capacity() - 8 <= 200  # 2,000/s x 0.1 s


@pytest.mark.parametrize("awaited", [False, True], ids=["threads", "event-loop"])
def test_a_group_with_a_rated_kind_claims_only_for_its_idle_threads_or_slots(awaited):
    # A claim is the start a rate counts: nothing claimed may wait to start later.
    clock = Clock()
    rated = Demand(8, awaited=awaited, rated=True, clock=clock)
    finishing(rated, clock, per_second=2000, seconds=2)
    assert rated.capacity() == 8
    unrated = Demand(8, awaited=awaited, clock=clock)
    finishing(unrated, clock, per_second=2000, seconds=2)
    assert unrated.capacity() > 8


def test_a_mixed_group_queues_its_unrated_kinds_and_caps_its_rated_ones_per_claim():
    """Rated kinds beside others: the others keep their queue; a claim takes of the
    rated ones the slots free now, or one when none is, less those still waiting."""

    async def deliver(intent: Any, attempt: Any) -> None:
        pass

    handlers = {"paced": deliver, "free": deliver, "alone": lambda i, a: None}
    threads, loop = claim_groups(handlers, 2, 8, 30.0, (), paced={"paced", "alone"})
    assert (loop.kinds, loop.paced, loop.demand._rated) == (["free", "paced"], {"paced"}, False)
    assert (threads.kinds, threads.paced, threads.demand._rated) == (["alone"], set(), True)
    slots = loop.demand
    assert [slots.paced(busy, 0) for busy in (0, 5, 8, 12)] == [8, 3, 1, 1]
    assert [slots.paced(busy, 1) for busy in (5, 8, 12)] == [2, 0, 0]


def test_an_ordered_kind_beside_others_is_paced_and_leaves_them_their_full_queue():
    """An ordered kind takes the limited claim, whose results ride it (``limited``),
    but only kinds capped by ``running`` or ``per_target`` shorten the queue ahead."""

    async def deliver(intent: Any, attempt: Any) -> None:
        pass

    policies = parse_limits({"ordered": {"ordered": True}, "rated": {"rate": "5/s"}})[2]
    assert paced_kinds(policies) == {"ordered", "rated"}
    handlers = {"ordered": deliver, "free": deliver, "capped": deliver}
    for limited, ahead in (({"ordered"}, True), ({"ordered", "capped"}, False)):
        _, loop = claim_groups(handlers, 2, 8, 30.0, limited, paced=paced_kinds(policies))
        assert (loop.paced, loop.limited) == ({"ordered"}, True)
        assert (loop.demand._ahead, loop.demand._rated) == (ahead, False), limited


def test_the_local_queue_is_bounded_by_queue_max_and_by_a_tenth_of_the_lease():
    clock = Clock()
    fast = Demand(8, clock=clock)
    finishing(fast, clock, per_second=100_000, seconds=2)
    assert fast.capacity() == 8 + demand.QUEUE_MAX
    short = Demand(8, lease=0.5, clock=clock)
    finishing(short, clock, per_second=2000, seconds=2)
    assert 95 <= short.capacity() - 8 <= 100  # 2,000/s x 0.05 s


def test_a_slow_rate_still_queues_one_claim_per_thread():
    clock = Clock()
    queue = Demand(8, clock=clock)
    finishing(queue, clock, per_second=50, seconds=2)  # 5 queued by rate: fewer than threads
    assert queue.capacity() == 16


def test_threads_that_stopped_returning_get_no_local_queue():
    clock = Clock()
    queue = Demand(8, clock=clock)
    finishing(queue, clock, per_second=2000, seconds=2)
    clock.now += demand.STALL_AFTER
    assert queue.stalled()
    assert queue.capacity() == 16  # one running and one queued per thread, as slow pools


def claim(priority: int, name: str, *, paced: bool = False) -> Claim:
    intent = Intent(id=name, kind="k", event_id=name, target="t", priority=priority)
    return Claim(intent=intent, attempt=Attempt(intent), handler=lambda i, a: None, paced=paced)


def names(claims: list[Claim]) -> list[str]:
    return [c.intent.id for c in claims]


def test_the_local_queue_puts_a_higher_priority_ahead_of_what_is_queued():
    jobs = LocalQueue()
    jobs.put_claims([claim(0, "a"), claim(0, "b")])
    jobs.put_claims([claim(50, "urgent"), claim(0, "c")])
    jobs.put_claims([claim(0, "d")])  # no higher than the last: appended
    assert names(jobs.take(10)) == ["urgent", "a", "b", "c", "d"]


def test_the_local_queue_keeps_claim_order_among_equal_priorities():
    jobs = LocalQueue()
    jobs.put_claims([claim(10, "a"), claim(0, "b")])
    jobs.put_claims([claim(5, "c"), claim(5, "d")])
    assert names(jobs.take(2)) == ["a", "c"]
    assert names(jobs.take(10)) == ["d", "b"]


def test_a_paced_claim_waits_ahead_of_every_other_whatever_its_priority():
    jobs = LocalQueue()
    jobs.put_claims([claim(50, "urgent"), claim(0, "a")])
    jobs.put_claims([claim(0, "b"), claim(0, "rated", paced=True), claim(0, "c")])
    jobs.put_claims([claim(0, "later", paced=True)])
    assert names(jobs.take(10)) == ["rated", "later", "urgent", "a", "b", "c"]
    jobs.put_claims([claim(0, "d"), claim(0, "first", paced=True)])  # into an empty queue
    assert names(jobs.take(10)) == ["first", "d"]


@pytest.fixture(autouse=True)
def queue_kinds() -> Iterator[None]:
    with external_kinds("q.noop", "q.quick", "q.block"):
        yield


@pytest.mark.django_db(transaction=True)
def test_a_pool_of_quick_handlers_claims_many_intents_per_statement(background):  # noqa: F811
    sizes: list[int] = []
    job = pool({"q.noop": lambda intent, attempt: None}, workers=2, drain=True)
    claim_many = job._manager.claim_many

    def recording(limit: int, **kwargs: Any) -> Any:
        sizes.append(limit)
        return claim_many(limit, **kwargs)

    job._manager.claim_many = recording  # type: ignore[method-assign]
    ids = enqueue_at("q.noop", 400, seconds_ago=1)
    assert background(job).join() == 0
    assert max(sizes) > 2 * 2  # beyond one running and one queued per thread
    assert {(row(id).state, row(id).attempts) for id in ids} == {(Intent.State.COMPLETED, 1)}


@pytest.mark.django_db(transaction=True)
def test_a_stalled_pool_gives_its_local_queue_back_unstarted(background):  # noqa: F811
    gate = threading.Event()
    started: list[str] = []

    def block(intent, attempt):
        started.append(intent.event_id)
        gate.wait(10)

    # Quick handlers first fill the queue; behind them, blocking ones stall the one thread.
    enqueue_at("q.quick", 200, seconds_ago=60)
    blocked = enqueue_at("q.block", 30, seconds_ago=30)
    job = background(pool({"q.quick": lambda i, a: None, "q.block": block}, workers=1))
    wait_for(lambda: started, "the first blocking handler")
    wait_for(lambda: running() <= 2, "the queue given back but one claim", timeout=5)
    pending = [row(id) for id in blocked if row(id).state == Intent.State.PENDING]
    assert len(pending) >= 28 - 2  # given back, or never claimed
    assert all(r.claim_token == "" for r in pending)
    assert started == ["q.block-0"]  # none of them ran meanwhile
    until = time.monotonic() + 3 * demand.STALL_AFTER
    while time.monotonic() < until:  # still stalled: what it gave back is not claimed again
        assert running() <= 2
        time.sleep(0.02)
    gate.set()
    wait_for(
        lambda: all(row(id).state == Intent.State.COMPLETED for id in blocked), "every blocked one"
    )
    assert job.finish() == 0
    # Claimed, perhaps given back (which takes its attempt back), then run once.
    assert {row(id).attempts for id in blocked} == {1}
