"""Held targets and the breaker across real worker processes (SPEC §14), rows checked after.

The handler ``test.partner`` plays one partner per target, switched by the
test through ``Effect`` rows (tests/testapp/handlers.py), and notes every
start with its time, so the test reads what each partner received and when.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone

from django_intents.models import Intent, TargetState
from django_intents.rules.targets import target_key
from tests.testapp.models import Effect

from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .workerutil import Worker, wait_for

KIND = "test.partner"
BREAKER = {"failures": 3, "cooldown": 1, "max_cooldown": 4}
INTENTS = {"LIMITS": {KIND: {"breaker": BREAKER}}, "POLL_INTERVAL": 0.05}


def enqueue(targets: list[str], seconds: float = 0.02) -> dict[str, list[str]]:
    """One intent per entry, due 1 ms apart in that order; each target's ids in order."""
    start = timezone.now() - timedelta(seconds=10)
    order: dict[str, list[str]] = {}
    for i, target in enumerate(targets):
        id = Intent.objects.enqueue(  # noqa: A001
            KIND, f"e{i}", target, {"seconds": seconds}, next_at=start + timedelta(milliseconds=i)
        )
        order.setdefault(target, []).append(id)
    return order


def switch(target: str, mode: str) -> None:
    Effect.objects.create(intent_id="switch", claim_token="", note=f"{target} {mode}")


def starts(target: str) -> list[float]:
    """When the partner ``target`` was called, in order."""
    notes = Effect.objects.exclude(intent_id__in=["switch", "accepted"])
    notes = notes.filter(note__startswith=f"{target} ")
    return sorted(float(note.split()[2]) for note in notes.values_list("note", flat=True))


def health(target: str) -> TargetState | None:
    return TargetState.objects.filter(key=target_key(KIND, target)).first()


def states(ids: list[str]) -> set[tuple[str, int]]:
    return {(r.state, r.attempts - r.snoozes) for r in Intent.objects.filter(id__in=ids)}


def pool(start: Callable[..., Worker], *extra: str, intents: dict[str, Any] = INTENTS) -> Worker:
    return start("--workers", "1", "--lease", "5", "--kinds", KIND, *extra, intents=intents)


def test_a_hold_stops_the_claims_of_its_target_only_until_it_ends(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    order = enqueue(["a", "b"] * 8)
    switch("a", "429:3")
    worker = pool(start_worker, intents={"POLL_INTERVAL": 0.05})
    wait_for(lambda: states(order["b"]) == {("completed", 1)}, "b to be delivered", timeout=30)
    held = health("a")
    assert held is not None and held.state == "held"
    first = starts("a")[0]
    assert Intent.objects.filter(id__in=order["a"], state="pending").count() == 8
    # A claim made while the hold was being written may have taken one more.
    during = [t for t in starts("a") if t < first + 2.5]
    assert len(during) <= 2, during
    assert Intent.objects.filter(id__in=order["a"], snoozes=0, attempts=0).count() >= 6
    switch("a", "up")
    wait_for(lambda: states(order["a"]) == {("completed", 1)}, "a after its hold", timeout=30)
    assert all(t >= first + 2.9 for t in starts("a")[len(during) :])
    assert Intent.objects.get(id=order["a"][0]).snoozes == 1
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)


def test_after_a_hold_the_pool_sends_at_the_pace_its_partner_took(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    """A partner that takes 5 requests a second and answers the rest 429 with a
    Retry-After of 1 s, sent to by 8 threads: the first burst is refused beyond
    its 5 (and the threads may send a second round before the 429 is written),
    then the pool keeps to the pace the hold taught it. Holds that only ended
    would send 8 at each end, 3 of them refused each second (about 20 of the
    requests after the first burst)."""
    order = enqueue(["a"] * 40, seconds=0.01)
    switch("a", "limit:5:1")
    worker = start_worker(
        "--workers", "8", "--lease", "5", "--kinds", KIND, intents={"POLL_INTERVAL": 0.05}
    )
    wait_for(lambda: states(order["a"]) == {("completed", 1)}, "a to be delivered", timeout=60)
    refused = sum(i.snoozes for i in Intent.objects.filter(id__in=order["a"]))
    sent = starts("a")
    taken = Effect.objects.filter(intent_id="accepted").values_list("note", flat=True)
    after_first = [t for t in sent if t > sent[0] + 0.5]  # the first burst went out unknowing
    taken_after = [t for t in (float(n.split()[1]) for n in taken) if t > sent[0] + 0.5]
    # A start a loaded machine delays past the pace's margin may still be refused.
    assert len(after_first) - len(taken_after) <= 5, (sent, sorted(taken_after))
    row = health("a")
    assert row is not None and row.paced_until is not None  # held or closed: paced
    assert len(starts("a")) == 40 + refused
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=15)


def wait_open(target: str, openings: int, timeout: float = 30) -> TargetState:
    def opened() -> TargetState | None:
        row = health(target)
        ok = row is not None and row.state == "open" and row.openings >= openings
        return row if ok else None

    return wait_for(opened, f"{target} opened {openings} time(s)", timeout=timeout)


def test_a_breaker_opens_probes_after_its_cooldown_and_closes_on_success(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    order = enqueue(["down", "up"] * 12)
    switch("down", "down")
    pool(start_worker)
    opened = wait_open("down", 1)
    assert opened.failures >= 3
    wait_for(lambda: states(order["up"]) == {("completed", 1)}, "the healthy target", timeout=30)
    # Three failures opened it (one more may have been claimed as it was written).
    first_open = starts("down")
    assert 3 <= len(first_open) <= 4, first_open
    reopened = wait_open("down", 2)
    # The probe failed: the cooldown doubled.
    assert 1.9 <= (reopened.until - reopened.updated_at).total_seconds() <= 2.1
    probes = starts("down")[len(first_open) :]
    assert len(probes) == 1 and probes[0] >= first_open[-1] + 0.9, probes
    switch("down", "up")
    wait_for(lambda: health("down") is None, "the breaker to close", timeout=30)
    failed = set(
        Intent.objects.filter(id__in=order["down"])
        .exclude(last_error="")
        .values_list("id", flat=True)
    )
    assert 3 <= len(failed) <= len(first_open) + 1  # the probe may be a retried one
    fine = [id for id in order["down"] if id not in failed]
    wait_for(lambda: states(fine) == {("completed", 1)}, "the partner's backlog", timeout=30)
    # The failed ones wait for their backoff; no attempt was burnt while it was open.
    # A retry whose backoff has run out may be running by now, or done: one that failed
    # as the breaker opened may also have been the failed probe, then succeeded (3).
    for intent in Intent.objects.filter(id__in=failed):
        assert intent.attempts <= 3, (intent.id, intent.attempts)
        assert intent.state in ("pending", "running", "completed"), (intent.id, intent.state)
    calls = starts("down")
    assert calls[len(first_open) + 1] >= probes[0] + 1.9  # the second probe, after 2 s
    assert TargetState.objects.count() == 0


def test_two_pools_share_the_breaker_and_make_one_probe_per_half_open(
    start_worker: Callable[..., Worker],  # noqa: F811 - the fixture
) -> None:
    order = enqueue(["down", "up"] * 20, seconds=0.05)
    switch("down", "down")
    intents = {**INTENTS, "LIMITS": {KIND: {"breaker": {**BREAKER, "cooldown": 1.5}}}}
    workers = []
    for _ in range(2):
        workers += [
            start_worker("--workers", "3", "--lease", "5", "--kinds", KIND, intents=intents)
        ]
    wait_open("down", 3, timeout=40)
    calls = starts("down")
    opened_at = calls[2]
    later = [t for t in calls if t > opened_at + 0.5]
    # After the first opening: one probe per half-open, across both pools, each
    # after a cooldown (1.5 s, then 3 s): never two close together.
    assert 1 <= len(later) <= 3, later
    gaps = [b - a for a, b in zip(later, later[1:], strict=False)]
    assert all(gap >= 1.4 for gap in gaps), gaps
    # Up to six claims (two pools of three workers) may have raced the first opening.
    assert len(calls) - len(later) <= 3 + 6
    wait_for(lambda: states(order["up"]) == {("completed", 1)}, "the healthy target", timeout=30)
    pending = Intent.objects.filter(id__in=order["down"], state="pending", attempts=0).count()
    assert pending >= 20 - len(calls)
    switch("down", "up")
    wait_for(lambda: health("down") is None, "the breaker to close", timeout=30)
    failed = Intent.objects.filter(id__in=order["down"]).exclude(last_error="")
    fine = Intent.objects.filter(id__in=order["down"], last_error="")
    wait_for(
        lambda: {r.state for r in fine.all()} == {"completed"},
        "the partner's backlog after it came back",
        timeout=40,
    )
    # The failed ones retry as their backoff runs out: stop both pools so that the
    # rows and the partner's log are read at one moment.
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.assert_clean_exit(timeout=15)
    assert sum(r.attempts for r in failed) + len(fine) == len(starts("down"))
    assert TargetState.objects.count() == 0
