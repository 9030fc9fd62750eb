"""The admin's *Redrive*: the list action on selected cancelled intents and the button on a
cancelled intent's page (SPEC §14), through Django's test client."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages.constants import SUCCESS, WARNING

from django_intents.models import Intent
from django_intents.store.clock import server_now

from .conftest import row, snapshot
from .test_admin import CHANGELIST, act, button_url, change_url, make, notes, viewer  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def mixed() -> dict[str, str]:
    return {
        "pending": make("pending", event="e-pending", next_in=600),
        "running": make("running", event="e-running"),
        "completed": make("completed", event="e-completed"),
        "cancelled": make("cancelled", event="e-cancelled", error="HTTP 410"),
        "cancelled_too": make("cancelled", event="e-cancelled-2", error="HTTP 500"),
    }


def others(mixed: dict[str, str], *keys: str) -> list[tuple]:
    ids = {mixed[key] for key in keys}
    return [r for r in snapshot() if r[0] not in ids]


def test_redrive_action_makes_the_cancelled_intents_pending_and_reports_the_rest(
    admin_client, admin_user, mixed
):
    untouched = others(mixed, "cancelled", "cancelled_too")
    before = server_now()
    response = act(admin_client, "redrive", list(mixed.values()))
    after = server_now()
    assert response.status_code == 302
    for key, error in (("cancelled", "HTTP 410"), ("cancelled_too", "HTTP 500")):
        intent = row(mixed[key])
        assert (intent.state, intent.attempts, intent.written_off) == ("pending", 1, 1)
        assert intent.last_error == error
        assert before <= intent.next_at <= after
    assert others(mixed, "cancelled", "cancelled_too") == untouched
    assert notes(response) == [
        (
            SUCCESS,
            "Redrove 2 cancelled intents: pending again, due now, with a fresh MAX_ATTEMPTS.",
        ),
        (WARNING, "Skipped 3 intents: 1 already completed, 1 still pending, 1 running."),
    ]
    logged = LogEntry.objects.filter(user=admin_user, action_flag=CHANGE)
    assert sorted(logged.values_list("object_id", flat=True)) == sorted(
        [mixed["cancelled"], mixed["cancelled_too"]]
    )
    assert set(logged.values_list("change_message", flat=True)) == {"Redriven."}


def test_redrive_action_on_no_cancelled_intent_only_says_why(admin_client, mixed):
    before = snapshot()
    response = act(admin_client, "redrive", [mixed["pending"]])
    assert notes(response) == [(WARNING, "Skipped 1 intent: 1 still pending.")]
    assert snapshot() == before


def test_redrive_action_applies_to_every_cancelled_intent_a_filter_matches(admin_client, mixed):
    response = admin_client.post(
        CHANGELIST + "?state__exact=cancelled",
        {
            "action": "redrive",
            "select_across": "1",
            "index": "0",
            "_selected_action": [mixed["cancelled"]],
        },
    )
    assert response.status_code == 302
    assert not Intent.objects.filter(state="cancelled").exists()
    assert notes(response) == [
        (
            SUCCESS,
            "Redrove 2 cancelled intents: pending again, due now, with a fresh MAX_ATTEMPTS.",
        )
    ]


def test_the_action_is_offered_only_to_users_who_may_change_intents(viewer, mixed):  # noqa: F811
    before = snapshot()
    html = viewer.get(CHANGELIST).content.decode()
    assert 'value="redrive"' not in html
    assert act(viewer, "redrive", [mixed["cancelled"]]).status_code == 403
    assert snapshot() == before


def test_a_cancelled_intents_page_has_the_redrive_button_only(admin_client, mixed):
    html = admin_client.get(change_url(mixed["cancelled"])).content.decode()
    form = re.search(
        rf'<form method="post" action="{re.escape(button_url("redrive", mixed["cancelled"]))}"'
        r"[^>]*>(.*?)</form>",
        html,
        re.S,
    )
    assert form is not None and ">Redrive</button>" in form.group(1)
    assert 'name="csrfmiddlewaretoken"' in form.group(1)
    assert button_url("retry_now", mixed["cancelled"]) not in html
    assert button_url("cancel", mixed["cancelled"]) not in html
    for key in ("pending", "running", "completed"):
        assert (
            button_url("redrive", mixed[key])
            not in admin_client.get(change_url(mixed[key])).content.decode()
        )


def test_the_redrive_button(admin_client, mixed):
    response = admin_client.post(button_url("redrive", mixed["cancelled"]))
    assert response.status_code == 302
    assert response["Location"] == change_url(mixed["cancelled"])
    assert row(mixed["cancelled"]).state == "pending"
    assert notes(response) == [
        (
            SUCCESS,
            "Redrove 1 cancelled intent: pending again, due now, with a fresh MAX_ATTEMPTS.",
        )
    ]


def test_the_redrive_button_of_an_intent_redriven_meanwhile_changes_nothing(admin_client, mixed):
    assert Intent.objects.redrive_many([mixed["cancelled"]]) == [mixed["cancelled"]]
    before = snapshot()
    response = admin_client.post(button_url("redrive", mixed["cancelled"]))
    assert notes(response) == [(WARNING, "Skipped 1 intent: 1 still pending.")]
    assert snapshot() == before
