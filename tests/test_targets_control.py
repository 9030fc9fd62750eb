"""SPEC §14 "Inspection and control": ``targets()``, ``open_target``, ``close_target``,
the signal they send, the metrics of targets and breakers, and ``intents_health``.

The breaker itself (a pool opening and half-opening a target) is another
module's; here its rows are written as the pools write them, in
``TargetState``, and the signal a pool sends is sent as it sends it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import execute_from_command_line
from django.db import OperationalError, connections, transaction
from prometheus_client import REGISTRY

from django_intents.models import Intent, TargetState
from django_intents.observability import metrics
from django_intents.rules.targets import TargetHealth, TargetRow, target_key
from django_intents.signals import target_state_changed
from django_intents.store import targetrows
from django_intents.store.clock import server_now

from .conftest import T0, at
from .test_metrics import scrape, series

HOOK = "https://partner.example/hook"


def put(
    kind: str,
    target: str,
    state: str,
    *,
    failures: int = 0,
    until: Any = None,
    last_error: str = "",
) -> TargetState:
    """A row as a pool writes it."""
    return TargetState.objects.create(
        key=target_key(kind, target),
        kind=kind,
        target=target,
        state=state,
        failures=failures,
        until=until,
        last_error=last_error,
        updated_at=T0,
    )


def stored() -> list[tuple[Any, ...]]:
    return list(TargetState.objects.order_by("key").values_list())


@pytest.fixture
def heard() -> Iterator[list[dict[str, Any]]]:
    """What ``target_state_changed`` says while the test runs."""
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append({"sender": sender, **{k: v for k, v in kwargs.items() if k != "signal"}})

    target_state_changed.connect(receiver)
    try:
        yield seen
    finally:
        target_state_changed.disconnect(receiver)


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any) -> Any:
    """Run what waits for the test's transaction to commit, as a commit would."""
    return django_capture_on_commit_callbacks


# -- targets() -----------------------------------------------------------------------


@pytest.mark.django_db
def test_targets_lists_every_target_not_plainly_healthy_in_kind_and_target_order():
    put("webhook", "b", TargetHealth.OPEN, failures=5, until=at(30), last_error="503")
    put("webhook", "a", TargetHealth.HELD, until=at(60))
    put("push", "z", TargetHealth.HALF_OPEN, failures=5)
    put("push", "y", TargetHealth.CLOSED, failures=2, last_error="timeout")
    put("push", "healthy", TargetHealth.CLOSED)  # a row about to go: not listed

    rows = Intent.objects.targets(now=at(10))

    assert [(r.kind, r.target) for r in rows] == [
        ("push", "y"),
        ("push", "z"),
        ("webhook", "a"),
        ("webhook", "b"),
    ]
    assert rows[3] == TargetRow("webhook", "b", TargetHealth.OPEN, 5, at(30), "503")
    assert rows[0].as_dict() == {
        "kind": "push",
        "target": "y",
        "state": "closed",
        "failures": 2,
        "until": None,
        "last_error": "timeout",
    }
    assert [r.blocking for r in rows] == [False, True, True, True]


@pytest.mark.django_db
def test_targets_shows_no_until_once_it_has_passed():
    put("webhook", "a", TargetHealth.HELD, until=at(60))
    put("webhook", "b", TargetHealth.OPEN, failures=3, until=at(30))
    rows = Intent.objects.targets(now=at(45))
    assert [(r.target, r.state, r.until) for r in rows] == [
        ("a", "held", at(60)),
        ("b", "open", None),
    ]
    assert not rows[1].blocking


@pytest.mark.django_db
def test_targets_narrows_by_kind_and_by_state():
    put("webhook", "a", TargetHealth.HELD, until=at(60))
    put("webhook", "b", TargetHealth.OPEN, failures=3, until=at(30))
    put("push", "c", TargetHealth.OPEN, failures=3, until=at(30))
    assert [r.target for r in Intent.objects.targets("webhook", now=T0)] == ["a", "b"]
    assert [r.target for r in Intent.objects.targets(state="open", now=T0)] == ["c", "b"]
    assert [r.target for r in Intent.objects.targets("push", "held", now=T0)] == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"state": "broken"}, "unknown target state 'broken'; expected one of closed, held"),
        ({"kind": ""}, "kind must not be empty"),
        ({"kind": 3}, "kind must be a string"),
    ],
)
def test_targets_refuses_an_unknown_state_or_a_bad_kind(kwargs, error):
    with pytest.raises(ValueError, match=error):
        Intent.objects.targets(**kwargs)


# -- open_target / close_target -----------------------------------------------------


@pytest.mark.django_db
def test_open_target_holds_a_healthy_target_for_the_seconds_given():
    assert Intent.objects.open_target("webhook", HOOK, 90, now=T0) is True
    row = TargetState.objects.get()
    assert (row.key, row.kind, row.target) == (target_key("webhook", HOOK), "webhook", HOOK)
    assert (row.state, row.until, row.failures, row.openings) == ("held", at(90), 0, 0)
    assert [r.as_dict()["state"] for r in Intent.objects.targets(now=at(1))] == ["held"]


@pytest.mark.django_db
def test_open_target_holds_an_open_target_and_keeps_its_counts():
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, until=at(30), last_error="503")
    TargetState.objects.update(openings=2)
    assert Intent.objects.open_target("webhook", HOOK, 600, now=at(10)) is True
    row = TargetState.objects.get()
    assert (row.state, row.until, row.failures, row.openings, row.last_error) == (
        "held",
        at(610),
        5,
        2,
        "503",
    )


@pytest.mark.django_db
def test_open_target_again_until_the_same_time_changes_nothing(heard, committed):
    with committed(execute=True):
        assert Intent.objects.open_target("webhook", HOOK, 60, now=T0)
        assert Intent.objects.open_target("webhook", HOOK, 50, now=at(10)) is False
        assert Intent.objects.open_target("webhook", HOOK, 120, now=at(10)) is True
    assert TargetState.objects.get().until == at(130)
    assert [(h["previous"], h["state"]) for h in heard] == [("closed", "held"), ("held", "held")]


@pytest.mark.django_db
def test_open_target_by_the_database_clock_without_now():
    before = server_now()
    assert Intent.objects.open_target("webhook", HOOK, 30)
    until = TargetState.objects.get().until
    assert before + timedelta(seconds=30) <= until <= server_now() + timedelta(seconds=30)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "target", "seconds", "error"),
    [
        ("webhook", HOOK, 0, ValueError("seconds must be a positive, finite number, not 0")),
        ("webhook", HOOK, -5, ValueError("seconds must be a positive, finite number")),
        ("webhook", HOOK, math.inf, ValueError("seconds must be a positive, finite number")),
        ("webhook", HOOK, math.nan, ValueError("seconds must be a positive, finite number")),
        ("webhook", HOOK, 1e300, ValueError("seconds must be shorter than")),
        ("webhook", HOOK, 1e12, ValueError("ends after the year 9999")),
        ("webhook", HOOK, "60", TypeError("seconds must be a number, not str")),
        ("webhook", HOOK, True, TypeError("seconds must be a number, not bool")),
        ("", HOOK, 60, ValueError("kind must not be empty")),
        ("webhook", "  ", 60, ValueError("target must not be blank")),
        ("webhook", "x" * 2049, 60, ValueError("target is 2049 characters long")),
        ("webhook", "a\x00b", 60, ValueError("target must not contain NUL")),
    ],
)
def test_open_target_refuses_bad_input_and_writes_nothing(
    kind, target, seconds, error, heard, committed
):
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, until=at(30))
    before = stored()
    with committed(execute=True), pytest.raises(type(error), match=str(error)):
        Intent.objects.open_target(kind, target, seconds, now=T0)
    assert stored() == before
    assert heard == []


@pytest.mark.django_db
def test_close_target_deletes_its_row_whatever_its_state(heard, committed):
    for target, state in (("a", "held"), ("b", "open"), ("c", "half_open"), ("d", "closed")):
        put("webhook", target, state, failures=3, until=at(30))
    put("push", "a", TargetHealth.OPEN, failures=3, until=at(30))
    with committed(execute=True):
        for target in "abcd":
            assert Intent.objects.close_target("webhook", target) is True
    assert list(TargetState.objects.values_list("kind", "target")) == [("push", "a")]
    assert [(h["target"], h["previous"], h["state"]) for h in heard] == [
        ("a", "held", "closed"),
        ("b", "open", "closed"),
        ("c", "half_open", "closed"),
        ("d", "closed", "closed"),
    ]


@pytest.mark.django_db
def test_close_target_of_a_healthy_target_changes_nothing(heard, committed):
    put("push", HOOK, TargetHealth.OPEN, failures=3, until=at(30))
    before = stored()
    with committed(execute=True):
        assert Intent.objects.close_target("webhook", HOOK) is False
    assert stored() == before
    assert heard == []


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "target"), [("", HOOK), ("webhook", None), ("k" * 101, HOOK)])
def test_close_target_refuses_bad_input_and_writes_nothing(kind, target):
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, until=at(30))
    before = stored()
    with pytest.raises(ValueError, match="kind|target"):
        Intent.objects.close_target(kind, target)
    assert stored() == before


@pytest.mark.django_db(transaction=True)
def test_the_signal_is_sent_once_the_change_commits_and_never_when_rolled_back(heard):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        assert Intent.objects.open_target("webhook", HOOK, 60, now=T0)
        assert heard == []
        raise Abort
    assert heard == []
    assert not TargetState.objects.exists()

    with transaction.atomic():
        assert Intent.objects.open_target("webhook", HOOK, 60, now=T0)
        assert heard == []  # not yet: it may still roll back
    assert heard == [
        {
            "sender": Intent,
            "kind": "webhook",
            "target": HOOK,
            "state": TargetHealth.HELD,
            "database": "default",
            "previous": TargetHealth.CLOSED,
        }
    ]
    assert Intent.objects.close_target("webhook", HOOK)  # outside a transaction: at once
    assert heard[-1]["state"] == "closed"
    assert heard[-1]["previous"] == "held"


# -- metrics ---------------------------------------------------------------------------


@pytest.fixture
def fresh_gauges() -> Iterator[None]:
    metrics.QUEUE.invalidate()
    yield
    metrics.QUEUE.invalidate()


def breaker_moves(kind: str, to: str) -> float:
    value = REGISTRY.get_sample_value(
        "django_intents_breaker_transitions_total", {"kind": kind, "to": to, "database": "default"}
    )
    assert value is not None, (kind, to)
    return value


@pytest.mark.django_db
def test_targets_gauge_counts_targets_per_kind_and_state(client, fresh_gauges):
    put("webhook", "a", TargetHealth.HELD, until=at(60))
    put("webhook", "b", TargetHealth.OPEN, failures=3, until=at(30))
    put("webhook", "c", TargetHealth.OPEN, failures=3, until=at(30))
    put("webhook", "d", TargetHealth.CLOSED, failures=1)
    put("webhook", "e", TargetHealth.CLOSED)  # healthy: not counted
    put("undeclared.kind", "f", TargetHealth.HALF_OPEN, failures=3)
    samples = scrape(client)
    name = "django_intents_targets"
    assert samples[series(name, kind="webhook", state="held")] == 1
    assert samples[series(name, kind="webhook", state="open")] == 2
    assert samples[series(name, kind="webhook", state="half_open")] == 0
    assert samples[series(name, kind="webhook", state="closed")] == 1
    assert samples[series(name, kind="other", state="half_open")] == 1
    # One series per kind label and state, never one per target.
    labels = {dict(labels)["kind"] for (n, labels) in samples if n == name}
    assert "undeclared.kind" not in labels
    assert len([key for key in samples if key[0] == name]) == 4 * len(labels)


@pytest.mark.django_db
def test_breaker_transitions_count_the_breakers_moves_only(client, committed):
    start = {to: breaker_moves("webhook", to) for to in ("open", "half_open", "closed")}

    def send(state: str, previous: str) -> None:
        target_state_changed.send(
            sender=Intent, kind="webhook", target=HOOK, state=state, previous=previous
        )

    send(TargetHealth.OPEN, TargetHealth.CLOSED)
    send(TargetHealth.HALF_OPEN, TargetHealth.OPEN)
    send(TargetHealth.OPEN, TargetHealth.HALF_OPEN)
    send(TargetHealth.HALF_OPEN, TargetHealth.OPEN)
    send(TargetHealth.CLOSED, TargetHealth.HALF_OPEN)
    with committed(execute=True):
        # Not a breaker's: a hold, and its release.
        assert Intent.objects.open_target("webhook", HOOK, 60, now=T0)
        assert Intent.objects.close_target("webhook", HOOK)
        # Closing an open breaker by hand is one.
        put("webhook", HOOK, TargetHealth.OPEN, failures=3, until=at(30))
        assert Intent.objects.close_target("webhook", HOOK)

    moved = {to: breaker_moves("webhook", to) - start[to] for to in start}
    assert moved == {"open": 2, "half_open": 2, "closed": 2}
    samples = scrape(client)
    assert series("django_intents_breaker_transitions_total", kind="other", to="open") in samples


# -- intents_health ----------------------------------------------------------------------


def health(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        execute_from_command_line(["manage.py", "intents_health", *args])
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.django_db(transaction=True)
def test_health_lists_held_open_and_half_open_targets_and_passes(capsys):
    now = server_now()
    put("webhook", HOOK, TargetHealth.HELD, until=now + timedelta(seconds=600))
    put("webhook", "b", TargetHealth.HALF_OPEN, failures=5)
    put("push", "c", TargetHealth.OPEN, failures=5, until=now + timedelta(seconds=60))
    put("push", "d", TargetHealth.CLOSED, failures=2)  # claimable: not listed
    put("push", "e", TargetHealth.OPEN, failures=5, until=now - timedelta(seconds=1))  # passed
    code, out, _ = health(capsys=capsys)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("target 'push' -> 'c': open until ")
    assert lines[1] == "target 'webhook' -> 'b': half_open"
    assert lines[2].startswith(f"target 'webhook' -> '{HOOK}': held until ")
    assert lines[3] == (
        "3 target(s) held, open or half-open: their intents wait on purpose, not counted as stuck"
    )
    assert lines[4] == "ok: nothing is due (0 pending, max age 300s)"


@pytest.mark.django_db(transaction=True)
def test_health_does_not_fail_for_intents_waiting_on_a_held_target(capsys):
    now = server_now()
    old = now - timedelta(seconds=900)
    Intent.objects.enqueue("webhook", "held-back", HOOK, next_at=old, now=old)
    Intent.objects.enqueue("webhook", "fresh", "https://other.example", now=now)
    assert Intent.objects.open_target("webhook", HOOK, 3600)
    code, out, _ = health(capsys=capsys)
    assert code == 0, out
    assert "1 target(s) held, open or half-open" in out
    assert "ok: oldest due intent (kind 'webhook') has waited" in out

    # Once the hold is lifted, the same intent is stuck.
    assert Intent.objects.close_target("webhook", HOOK)
    code, out, err = health(capsys=capsys)
    assert code == 1
    assert "stuck: oldest due intent (kind 'webhook') has waited 9" in err


@pytest.mark.django_db(transaction=True)
def test_health_still_fails_for_a_stuck_intent_of_another_target_of_the_kind(capsys):
    now = server_now()
    old = now - timedelta(seconds=900)
    Intent.objects.enqueue("webhook", "held-back", HOOK, next_at=old, now=old)
    Intent.objects.enqueue("webhook", "stuck", "https://other.example", next_at=old, now=old)
    assert Intent.objects.open_target("webhook", HOOK, 3600)
    code, _, err = health(capsys=capsys)
    assert code == 1
    assert "stuck: oldest due intent (kind 'webhook')" in err


@pytest.mark.django_db(transaction=True)
def test_health_names_the_first_ten_targets_and_counts_the_rest(capsys):
    until = server_now() + timedelta(seconds=600)
    for n in range(12):
        put("webhook", f"t{n:02}", TargetHealth.HELD, until=until)
    code, out, _ = health(capsys=capsys)
    assert code == 0
    assert out.count("target 'webhook' -> ") == 10
    assert "12 target(s) held, open or half-open (2 more not listed)" in out


# -- concurrency ---------------------------------------------------------------------------


def race(calls: list[Any]) -> tuple[list[Any], list[BaseException]]:
    """Run ``calls`` at once, each on a thread and a connection of its own."""
    start = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int, call: Any) -> None:
        try:
            start.wait()
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results, errors


@pytest.mark.django_db(transaction=True)
def test_racing_holds_of_an_existing_target_each_see_the_state_they_replaced(heard):
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, until=at(30))
    calls = [
        lambda n=n: Intent.objects.open_target("webhook", HOOK, 60 + n, now=T0) for n in range(4)
    ]
    results, errors = race(calls)
    assert errors == []
    assert results == [True] * 4
    row = TargetState.objects.get()
    assert (row.state, row.failures) == ("held", 5)
    # Each replaced the state before it: exactly one saw the open breaker.
    assert sorted(h["previous"] for h in heard) == ["held", "held", "held", "open"]


@pytest.mark.django_db(transaction=True)
def test_a_hold_racing_a_close_leaves_one_or_the_other_never_an_error():
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, until=at(30))
    results, errors = race(
        [
            lambda: Intent.objects.open_target("webhook", HOOK, 60, now=T0),
            lambda: Intent.objects.close_target("webhook", HOOK),
        ]
    )
    assert errors == []
    assert results == [True, True]
    rows = list(TargetState.objects.values_list("state", "until"))
    assert rows in ([], [("held", at(60))])


@pytest.mark.django_db(transaction=True)
def test_racing_holds_of_a_new_target_make_one_row_and_none_fails(heard):
    # MySQL locks the gap of a row not there yet: the deadlock's victim is tried again.
    calls = [
        lambda n=n: Intent.objects.open_target("webhook", HOOK, 60 + n, now=T0) for n in range(4)
    ]
    results, errors = race(calls)
    assert errors == []
    assert results == [True] * 4
    assert TargetState.objects.get().state == "held"
    assert sorted(h["previous"] for h in heard) == ["closed", "held", "held", "held"]


@pytest.mark.django_db(transaction=True)
def test_only_a_deadlock_outside_the_callers_transaction_is_tried_again():
    calls: list[int] = []

    def change(error: OperationalError, fails: int) -> str:
        calls.append(1)
        if len(calls) <= fails:
            raise error
        return "done"

    deadlock = OperationalError(targetrows.MYSQL_DEADLOCK, "Deadlock found")
    assert targetrows._retried("default", lambda: change(deadlock, 2)) == "done"
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(OperationalError):
        targetrows._retried("default", lambda: change(deadlock, targetrows.TRIES))
    assert len(calls) == targetrows.TRIES
    calls.clear()
    with pytest.raises(OperationalError, match="server has gone away"):
        targetrows._retried(
            "default", lambda: change(OperationalError(2006, "server has gone away"), 1)
        )
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(OperationalError), transaction.atomic():
        targetrows._retried("default", lambda: change(deadlock, 1))
    assert len(calls) == 1  # the caller's transaction is gone: the caller's to retry
