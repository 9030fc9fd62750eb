"""``manage.py intents_redrive``: the options, what it prints, what it refuses (SPEC §14)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from django_intents.models import Intent

from .conftest import T0, at, row, snapshot

pytestmark = pytest.mark.django_db


def cancelled(kind: str, target: str, seconds: float, event: str) -> str:
    id = Intent.objects.enqueue(kind, event, target, {"e": event}, now=T0)  # noqa: A001
    assert Intent.objects.cancel(id, now=at(seconds))
    return id


@pytest.fixture
def four() -> dict[str, str]:
    return {
        "a": cancelled("webhook", "x", 10, "a"),
        "b": cancelled("webhook", "y", 20, "b"),
        "c": cancelled("push", "x", 30, "c"),
        "d": cancelled("push", "y", 40, "d"),
    }


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("intents_redrive", *args, stdout=out)
    return out.getvalue()


def states(ids: dict[str, str]) -> dict[str, str]:
    return {name: row(id).state for name, id in ids.items()}


def test_without_options_every_cancelled_intent_is_redriven(four):
    output = run()
    assert output.splitlines() == ["Redrove 4 cancelled intents: pending again, due now."]
    assert set(states(four).values()) == {"pending"}


def test_kind_and_target_options(four):
    assert run("--kind", "push", "--target", "y").splitlines() == [
        "Redrove 1 cancelled intent: pending again, due now."
    ]
    assert states(four) == {"a": "cancelled", "b": "cancelled", "c": "cancelled", "d": "pending"}


def test_since_and_until_bound_when_they_were_cancelled(four):
    since, until = at(20).isoformat(), at(40).isoformat()
    assert "Redrove 2 " in run("--since", since, "--until", until)
    assert states(four) == {"a": "cancelled", "b": "pending", "c": "pending", "d": "cancelled"}


def test_a_time_without_an_offset_is_in_time_zone_and_z_is_utc(four, settings):
    settings.TIME_ZONE = "Europe/Paris"  # UTC+1 in January: 13:00:15 there is 12:00:15 UTC
    assert "Redrove 1 " in run("--until", "2026-01-01T13:00:15")
    assert "Redrove 1 " in run("--until", "2026-01-01T12:00:25Z")
    assert states(four) == {"a": "pending", "b": "pending", "c": "cancelled", "d": "cancelled"}


def test_dry_run_counts_and_changes_nothing(four):
    before = snapshot()
    assert run("--dry-run", "--kind", "webhook").splitlines() == [
        "2 cancelled intents would be redriven.",
        "Dry run: nothing was changed.",
    ]
    assert snapshot() == before


def test_off_a_terminal_there_is_no_progress_bar(four):
    output = run()
    assert "\r" not in output and "redriving" not in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "yesterday"), "argument --since: 'yesterday' is not an ISO 8601"),
        (("--until", "2026-13-01"), "argument --until: '2026-13-01' is not an ISO 8601"),
        (("--kind", ""), "argument --kind: kind must not be empty"),
        (("--since", "2026-01-02", "--until", "2026-01-01"), "--since .* must be earlier than"),
        (("--database", "elsewhere"), "unknown database alias 'elsewhere'"),
    ],
)
def test_bad_options_are_refused_naming_them_and_nothing_changes(four, args, message):
    before = snapshot()
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert snapshot() == before
