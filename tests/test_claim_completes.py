"""A claim that completes finished claims first: ``claim_many(complete=...)`` and the pool's riders.

Under ``LIMITS`` a finished claim holds its target's place until its result
is written. A pool hands the successes of a turn to its next claim, which
completes them before it counts the places (on PostgreSQL in the claim's one
round trip), so a place frees for the claim that follows the delivery. Every
test checks the rows: what was not completed still holds its claim, and a
refused call writes nothing.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError

from django_intents.attempt import Attempt
from django_intents.models import Intent
from django_intents.rules.batches import INSERT_BATCH
from django_intents.signals import Outcome
from django_intents.store.claims import Claims
from django_intents.worker.execution import Claim
from django_intents.worker.recorder import Recorder

from .conftest import at, row, snapshot
from .test_limits import HOOK, enqueue, kinds, limits, running_per_target  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def one_running_one_held() -> tuple[Intent, str]:
    """Under ``per_target`` 1 (the caller's ``limits``): the first intent of a target
    running, the second held back behind it."""
    first, second = enqueue(["partner", "partner"])
    [running] = Intent.objects.claim_many(5, now=at(60))
    assert running.id == first
    assert Intent.objects.claim_many(5, now=at(61)) == []
    return running, second


def test_a_claim_completes_what_it_is_given_first_and_takes_the_place_it_freed():
    with limits(per_target=1):
        running, second = one_running_one_held()
        claimed = Intent.objects.claim_many(
            5, now=at(62), complete=[(running.id, running.claim_token)]
        )
    assert [i.id for i in claimed] == [second]
    assert claimed.completed == [running.id]
    done = row(running.id)
    assert (done.state, done.claim_token, done.claim_until, done.updated_at) == (
        "completed",
        "",
        None,
        at(62),
    )
    assert running_per_target() == {"partner": 1}


def test_with_room_from_the_start_the_completion_still_frees_the_place_for_the_plain_claim():
    """No held-back claim first: on PostgreSQL the claim tries its plain statement,
    whose room test must already see the completion."""
    with limits(per_target=1):
        first, second = enqueue(["partner", "partner"])
        [running] = Intent.objects.claim_many(1, now=at(60))
        claimed = Intent.objects.claim_many(
            1, now=at(61), complete=[(running.id, running.claim_token)]
        )
    assert [i.id for i in claimed] == [second]
    assert row(first).state == "completed"


def test_a_stale_token_completes_nothing_and_the_place_stays_taken():
    with limits(per_target=1):
        running, second = one_running_one_held()
        claimed = Intent.objects.claim_many(5, now=at(62), complete=[(running.id, "0" * 32)])
    assert claimed == []
    assert claimed.completed == []
    kept = row(running.id)
    assert (kept.state, kept.claim_token) == ("running", running.claim_token)
    assert row(second).state == "pending"


def test_completions_are_announced_like_complete_many(announced):
    with limits(per_target=1):
        running, _ = one_running_one_held()
        announced.clear()
        Intent.objects.claim_many(5, now=at(62), complete=[(running.id, running.claim_token)])
    assert ("completed", [HOOK]) in announced
    assert ("running", [HOOK]) in announced


def test_without_limits_the_completions_come_first_all_the_same():
    first, second = enqueue(["a", "b"])
    [running] = Intent.objects.claim_many(1, now=at(60))
    claimed = Intent.objects.claim_many(5, now=at(61), complete=[(running.id, running.claim_token)])
    assert [i.id for i in claimed] == [second]
    assert claimed.completed == [first]
    assert row(first).state == "completed"


def test_a_claim_of_no_kinds_still_completes_what_it_is_given():
    [first] = enqueue(["a"])
    [running] = Intent.objects.claim_many(1, now=at(60))
    claimed = Intent.objects.claim_many(
        5, now=at(61), kinds=[], complete=[(running.id, running.claim_token)]
    )
    assert claimed == []
    assert claimed.completed == [first]
    assert row(first).state == "completed"


@pytest.mark.parametrize(
    ("complete", "error", "message"),
    [
        ("abc", TypeError, "complete must be an iterable of (id, claim_token) pairs"),
        ([("id", 7)], TypeError, "claim_token must be a string, not int"),
        ([("", "t")], ValueError, "id"),
        (
            [(f"i{n}", "t") for n in range(INSERT_BATCH + 1)],
            ValueError,
            f"complete takes at most {INSERT_BATCH} pairs, not {INSERT_BATCH + 1}",
        ),
    ],
)
def test_bad_pairs_are_refused_before_anything_is_written(complete, error, message):
    with limits(per_target=1):
        one_running_one_held()
        before = snapshot()
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            Intent.objects.claim_many(5, now=at(62), complete=complete)
    assert snapshot() == before


# -- the pool's recorder ---------------------------------------------------------


def succeeded(intent: Intent) -> Claim:
    return Claim(intent, Attempt(intent), handler=print, outcome=Outcome.SUCCESS)


def handed_back(success: Intent) -> Recorder:
    """A pool's recorder (with a writer thread) after a turn that took ``success`` back."""
    recorder = Recorder(Intent.objects, max_attempts=None, threaded=True, wake=lambda: None)
    assert recorder.add(succeeded(success)) is None
    assert recorder.record() == []  # kept for the claim: nothing for the writer
    return recorder


def claim_with(recorder: Recorder, *, now: float, limit: int = 5) -> list[Intent]:
    claimed, results = recorder.claiming(
        lambda done: Intent.objects.claim_many(limit, now=at(now), complete=done), ride=True
    )
    assert all(outcome is Outcome.SUCCESS for _, outcome in results)
    return list(claimed)


def test_the_pool_hands_a_turns_successes_of_limited_kinds_to_its_next_claim():
    with limits(per_target=1):
        running, second = one_running_one_held()
        recorder = handed_back(running)
        assert len(recorder) == 1
        claimed = claim_with(recorder, now=62)
    assert [i.id for i in claimed] == [second]
    assert len(recorder) == 0
    assert row(running.id).state == "completed"


def test_a_claim_that_fails_leaves_the_successes_to_the_writer_and_none_is_lost():
    with limits(per_target=1):
        running, second = one_running_one_held()
        recorder = handed_back(running)

        def broken(done: list[tuple[str, str]]) -> None:
            assert done == [(running.id, running.claim_token)]
            raise DatabaseError("connection lost")

        with pytest.raises(DatabaseError):
            recorder.claiming(broken, ride=True)  # type: ignore[arg-type]
        assert len(recorder) == 1
        assert row(running.id).state == "running"
        recorder.threaded = False  # write it here, not on a thread of its own
        [(claim, outcome)] = recorder.record()
    assert (claim.intent.id, outcome) == (running.id, Outcome.SUCCESS)
    assert row(running.id).state == "completed"
    assert row(second).state == "pending"


def test_successes_a_turn_did_not_claim_with_go_to_the_writer_next_turn():
    with limits(per_target=1):
        running, _ = one_running_one_held()
        recorder = handed_back(running)
        given: list[list[tuple[str, str]]] = []
        recorder.claiming(lambda done: given.append(done) or Claims(), ride=False)
        assert given == [[]]  # an unlimited group's claim: nothing to complete
        recorder.threaded = False
        [(_, outcome)] = recorder.record()
    assert outcome is Outcome.SUCCESS
    assert row(running.id).state == "completed"


def test_a_success_whose_claim_was_lost_meanwhile_is_dropped_and_its_row_left_alone():
    with limits(per_target=1):
        running, second = one_running_one_held()
        recorder = handed_back(running)
        assert Intent.objects.cancel(running.id)  # an operator, while the result waited
        claimed, results = recorder.claiming(
            lambda done: Intent.objects.claim_many(5, now=at(62), complete=done), ride=True
        )
    assert [(claim.intent.id, outcome) for claim, outcome in results] == [
        (running.id, Outcome.FENCED)
    ]
    assert claimed.completed == []
    assert [i.id for i in claimed] == [second]
    lost = row(running.id)
    assert (lost.state, lost.claim_token) == ("cancelled", "")
    assert len(recorder) == 0


def test_only_successes_of_kinds_with_limits_ride_failures_go_to_the_writer():
    with limits(per_target=1):
        running, _ = one_running_one_held()
        recorder = Recorder(Intent.objects, max_attempts=None, threaded=False, wake=lambda: None)
        failed = Claim(running, Attempt(running), handler=print, outcome=Outcome.ERROR, cause="x")
        recorder.add(failed)
        [(_, outcome)] = recorder.record()
    assert outcome is Outcome.ERROR
    assert row(running.id).state == "pending"


def test_while_claims_find_room_for_all_they_ask_successes_go_straight_to_the_writer():
    """A limit that never binds: completing in the claim would only lengthen the turn."""
    with limits(per_target=100):
        first, second, third = enqueue(["a", "a", "a"])
        recorder = Recorder(Intent.objects, max_attempts=None, threaded=True, wake=lambda: None)
        [running] = claim_with(recorder, now=60, limit=1)  # room for all it asked: not bound
        assert running.id == first
        recorder.add(succeeded(running))
        given: list[list[tuple[str, str]]] = []

        def claim(done: list[tuple[str, str]]) -> Claims[Intent]:
            given.append(done)
            return Intent.objects.claim_many(1, now=at(61), complete=done)

        recorder.claiming(claim, ride=True)
        recorder.threaded = False  # write here what the writer thread would have
        [(_, outcome)] = recorder.record()
    assert given == [[]]
    assert outcome is Outcome.SUCCESS
    assert row(first).state == "completed"
    assert row(second).state == "running"
    assert row(third).state == "pending"
