"""``"ordered": True`` (SPEC §14) across real worker processes, read from what the handlers noted.

Two ``run_intent_workers`` processes at once, each with more threads (or
event-loop slots) than there are targets, and a local queue claimed ahead:
each handler notes its start and its end (``tests/testapp/ordered.py``), and
the notes' ids give one order across both processes. Per target, the notes
must alternate start and end (never two of one target at once) and follow
the order the intents were created in (a failing head retries first, the
rest of its target waits for it). Every test checks the rows afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_intents.models import Intent
from tests.testapp.models import Effect

from .conftest import external_kinds
from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .testapp.ordered import HANDLERS
from .workerutil import Worker

SYNC, ASYNC = "test.ordered", "test.aordered"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(*HANDLERS):
        yield


def settings(kind: str) -> dict[str, Any]:
    return {"LIMITS": {kind: {"ordered": True}}, "POLL_INTERVAL": 0.05, "HANDLERS": HANDLERS}


def enqueue(
    kind: str, targets: list[str], payloads: dict[int, dict[str, Any]]
) -> dict[str, list[str]]:
    """One intent per entry, created in that order, all due already; each target's ids in order.

    The later intents of a target are due *earlier* than the first: were due
    order the rule, they would go first. ``payloads`` by position.
    """
    now = timezone.now()
    order: dict[str, list[str]] = {}
    for i, target in enumerate(targets):
        first = target not in order
        id = Intent.objects.enqueue(  # noqa: A001
            kind,
            f"e{i}",
            target,
            payloads.get(i, {}),
            next_at=now - timedelta(seconds=5 if first else 10),
        )
        order.setdefault(target, []).append(id)
    return order


def check_order(order: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    """Each target's notes alternate start and end, and go through its intents in order."""
    target_of = {id: target for target, ids in order.items() for id in ids}
    notes: dict[str, list[tuple[str, str]]] = {target: [] for target in order}
    for intent_id, text in Effect.objects.order_by("id").values_list("intent_id", "note"):
        notes[target_of[intent_id]].append((intent_id, text))
    for target, seen in notes.items():
        for i in range(0, len(seen), 2):
            (started, start), (ending, end) = seen[i], seen[i + 1]
            assert started == ending and start.startswith("start "), (target, seen)
            assert end.split()[0] in ("done", "fail"), (target, seen)
            assert start.split()[1] == end.split()[1], (target, seen)
        runs = [id for id, text in seen if text.startswith("done")]
        assert runs == order[target], (target, seen)
        # Nothing of the target started between a failed attempt and its retry.
        starts = [id for id, text in seen if text.startswith("start")]
        assert starts == sorted(starts, key=order[target].index), (target, seen)
    return notes


def drain(start: Callable[..., Worker], kind: str, *args: str) -> None:
    workers = [start(*args, "--lease", "5", "--drain", intents=settings(kind)) for _ in range(2)]
    try:
        for worker in workers:
            assert worker.wait(20) == 0, worker.log
    except AssertionError:
        for r in Intent.objects.order_by("created_at"):
            print(r.target, r.id[:6], r.state, r.attempts, r.next_at, r.created_at, r.claim_until)
        print(list(Effect.objects.order_by("id").values_list("intent_id", "note")))
        raise


def test_two_pools_of_threads_start_each_target_one_at_a_time_in_order(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = [f"t{i % 5}" for i in range(40)]
    order = enqueue(SYNC, targets, {})
    drain(start_worker, SYNC, "--workers", "8")
    check_order(order)
    rows = Intent.objects.filter(kind=SYNC)
    assert {(r.state, r.attempts, r.claim_token) for r in rows} == {("completed", 1, "")}
    assert rows.count() == 40


def test_a_failing_head_holds_its_target_only_across_two_pools(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = ["bad"] * 4 + [f"ok{i % 3}" for i in range(18)]
    order = enqueue(SYNC, targets, {0: {"fail_attempts": 1}})
    drain(start_worker, SYNC, "--workers", "6")
    notes = check_order(order)
    head = order["bad"][0]
    assert [text for _, text in notes["bad"][:4]] == ["start 1", "fail 1", "start 2", "done 2"]
    # The other targets did not wait for the failing head's backoff (two seconds).
    retried = Effect.objects.get(intent_id=head, note="start 2").id
    last_ok = max(
        Effect.objects.filter(
            intent_id__in=[id for t in ("ok0", "ok1", "ok2") for id in order[t]]
        ).values_list("id", flat=True)
    )
    assert last_ok < retried
    rows = {r.id: r for r in Intent.objects.filter(kind=SYNC)}
    assert {(r.state, r.claim_token) for r in rows.values()} == {("completed", "")}
    assert rows[head].attempts == 2 and "partner refused attempt 1" in rows[head].last_error
    assert {rows[id].attempts for id in order["bad"][1:]} == {1}


def test_two_pools_of_async_handlers_keep_each_target_in_order(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = [f"t{i % 4}" for i in range(32)]
    order = enqueue(ASYNC, targets, {5: {"fail_attempts": 1}})
    drain(start_worker, ASYNC, "--workers", "1", "--concurrency", "16")
    check_order(order)
    rows = Intent.objects.filter(kind=ASYNC)
    assert {(r.state, r.claim_token) for r in rows} == {("completed", "")}
    assert sorted(r.attempts for r in rows) == [1] * 31 + [2]
