"""``LIMITS[kind]["rate"]`` (SPEC §14) across real worker processes.

Each handler notes when its attempt started (``testapp/paced.py``): the
claim's time, which is the start the rate counts, and its own wall clock.
No window of the rate's length may hold more than N starts of one target,
however many pools claim; other targets and unrated kinds are not slowed;
a pool wakes when a window reopens, not at its poll interval.
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
from .testapp.paced import HANDLERS
from .workerutil import Worker

PACED, ASYNC_PACED, FREE = "test.paced", "test.async_paced", "test.ok"
N, WINDOW = 4, 1.0
# The wall clock of a handler's start trails its claim by a few milliseconds,
# not always the same few: its windows are checked this much shorter.
HANDOFF = 0.1
# A poll three windows long: a pool that waited for it rather than for the window
# to reopen would take three times as long as the rate allows.
POLL = 3.0


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(*HANDLERS):
        yield


def settings(kind: str) -> dict[str, Any]:
    return {
        "LIMITS": {kind: {"rate": f"{N}/{WINDOW:g}s"}},
        "HANDLERS": HANDLERS,
        "POLL_INTERVAL": POLL,
    }


def enqueue(kind: str, targets: dict[str, int]) -> None:
    start = timezone.now() - timedelta(seconds=10)
    i = 0
    for target, count in targets.items():
        for _ in range(count):
            Intent.objects.enqueue(kind, f"e{i}", target, next_at=start + timedelta(milliseconds=i))
            i += 1


def starts(kind: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per target, the claims' times and the handlers' own start times, each sorted."""
    targets = dict(Intent.objects.filter(kind=kind).values_list("id", "target"))
    found: dict[str, tuple[list[float], list[float]]] = {}
    for intent_id, note in Effect.objects.filter(intent_id__in=targets).values_list(
        "intent_id", "note"
    ):
        claimed, began = (float(part) for part in note.split())
        times = found.setdefault(targets[intent_id], ([], []))
        times[0].append(claimed)
        times[1].append(began)
    return {target: (sorted(c), sorted(b)) for target, (c, b) in found.items()}


def fullest(times: list[float], window: float) -> int:
    """The most of ``times`` inside one half-open window of ``window`` seconds."""
    return max(sum(1 for t in times[i:] if t - start < window) for i, start in enumerate(times))


def check(kind: str, targets: dict[str, int]) -> float:
    """Check the starts of ``kind`` and its rows; return its first start's time."""
    found = starts(kind)
    assert {t: len(c) for t, (c, _) in found.items()} == targets
    for target, (claimed, began) in found.items():
        reached = min(N, targets[target])
        assert fullest(claimed, WINDOW) == reached, (target, claimed)  # reached, never passed
        assert fullest(began, WINDOW - HANDOFF) <= N, (target, began)
        # The rate paced the target: its starts span the windows it needed, and
        # no more (each reopening woke a pool, not its poll).
        windows = (targets[target] - 1) // N * WINDOW
        assert windows - 0.01 <= claimed[-1] - claimed[0] < windows + POLL / 2, claimed
    rows = Intent.objects.filter(kind=kind)
    assert {(r.state, r.attempts, r.claim_token) for r in rows} == {("completed", 1, "")}
    return min(claimed[0] for claimed, _ in found.values())


def test_two_pools_share_one_rate_and_no_window_holds_more_than_n_starts(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = {"a": 12, "b": 8}
    enqueue(PACED, targets)
    for i in range(20):
        Intent.objects.enqueue(FREE, f"free-{i}", "a")
    workers = [
        start_worker("--workers", "4", "--lease", "5", "--drain", intents=settings(PACED))
        for _ in range(2)
    ]
    for worker in workers:
        assert worker.wait(60) == 0, worker.log
    first = check(PACED, targets)
    # The unrated kind on the same target ran as it came, all of it in the first window.
    free = Intent.objects.filter(kind=FREE)
    assert {(r.state, r.attempts) for r in free} == {("completed", 1)}
    assert max(r.updated_at.timestamp() for r in free) - first < WINDOW


def test_async_handlers_start_within_the_rate(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = {"a": 10, "b": 6, "c": 3}
    enqueue(ASYNC_PACED, targets)
    worker = start_worker(
        "--workers",
        "1",
        "--concurrency",
        "16",
        "--lease",
        "5",
        "--drain",
        intents=settings(ASYNC_PACED),
    )
    assert worker.wait(60) == 0, worker.log
    check(ASYNC_PACED, targets)


def test_a_rate_with_per_target_runs_one_at_a_time_within_the_rate(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    targets = {"a": 9, "b": 5}
    enqueue(PACED, targets)
    intents = settings(PACED)
    intents["LIMITS"][PACED]["per_target"] = 1
    worker = start_worker("--workers", "4", "--lease", "5", "--drain", intents=intents)
    assert worker.wait(60) == 0, worker.log
    check(PACED, targets)
    for target, (_, began) in starts(PACED).items():
        # Each handler sleeps 20 ms; the next of its target starts only after it.
        gaps = [later - earlier for earlier, later in zip(began, began[1:], strict=False)]
        assert min(gaps) >= 0.02, (target, gaps)
