"""SPEC §14 "Admin": the Targets page, its Close now and Hold for… buttons, the
dashboard's Targets section, and the intents list filtered by target.

Driven through Django's test client as an operator's browser would: the
page lists what ``TargetState`` holds (written here as the pools write it),
and a button's POST goes through the manager and comes back with a message.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.contrib.messages.constants import ERROR, SUCCESS, WARNING
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_intents.admin import targets as targets_page
from django_intents.models import Intent, TargetState
from django_intents.rules.targets import TargetHealth, target_key
from django_intents.store.clock import server_now

from .test_admin import make, operator, staff, viewer  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

PAGE = reverse("admin:django_intents_intent_targets")
DASHBOARD = reverse("admin:django_intents_intent_dashboard")
CHANGELIST = reverse("admin:django_intents_intent_changelist")
HOOK = "https://partner.example/hooks/" + "x" * 80


def put(
    kind: str,
    target: str,
    state: str,
    *,
    failures: int = 0,
    seconds: float | None = None,
    last_error: str = "",
) -> None:
    now = server_now()
    TargetState.objects.create(
        key=target_key(kind, target),
        kind=kind,
        target=target,
        state=state,
        failures=failures,
        until=None if seconds is None else now + timedelta(seconds=seconds),
        last_error=last_error,
        updated_at=now,
    )


def stored() -> list[tuple[Any, ...]]:
    return list(TargetState.objects.order_by("key").values_list())


def notes(response: Any) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def row_html(html: str, target: str) -> str:
    return html.split(f'data-target="{target}"')[1].split("</tr>")[0]


@pytest.fixture
def unhealthy() -> None:
    put("webhook", HOOK, TargetHealth.OPEN, failures=5, seconds=120, last_error="HTTP 503\nbody")
    put("webhook", "https://b.example", TargetHealth.HELD, seconds=600)
    put("push", "device-1", TargetHealth.CLOSED, failures=2, last_error="timeout")
    put("push", "fine", TargetHealth.CLOSED)  # healthy: not listed
    make("pending", kind="webhook", event="p1", target=HOOK)
    make("pending", kind="webhook", event="p2", target=HOOK)
    make("running", kind="webhook", event="r1", target=HOOK)
    make("completed", kind="webhook", event="c1", target=HOOK)
    make("pending", kind="push", event="p3", target=HOOK)  # another kind: not counted
    make("pending", kind="webhook", event="p4", target="https://other.example")


# -- the page ------------------------------------------------------------------------


def test_the_page_lists_every_target_not_plainly_healthy(admin_client, unhealthy):
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    rows = response.context["rows"]
    assert [(r.row.kind, r.row.target, r.row.state) for r in rows] == [
        ("push", "device-1", "closed"),
        ("webhook", "https://b.example", "held"),
        ("webhook", HOOK, "open"),
    ]
    assert [(r.pending, r.running) for r in rows] == [(0, 0), (0, 0), (2, 1)]
    html = response.content.decode()
    open_row = row_html(html, HOOK)
    assert f'title="{HOOK}"' in open_row  # the whole target on hover
    assert HOOK not in open_row.replace(f'title="{HOOK}"', "").replace(
        f'data-target="{HOOK}"', ""
    ).replace(f'value="{HOOK}"', "")  # shown shortened
    assert 'data-state="open"' in open_row
    assert "until in 2 min" in open_row
    assert "HTTP 503" in open_row and "body" not in open_row.split("title=")[0]
    assert "<td data-failures>5</td>" in open_row
    assert "<span data-pending>2</span> / <span data-running>1</span>" in open_row
    assert 'data-state-count="open">1<' in html
    assert 'data-state-count="closed">1<' in html
    assert "fine" not in [r.row.target for r in rows]


def test_the_page_says_when_every_target_is_healthy(admin_client):
    html = admin_client.get(PAGE).content.decode()
    assert 'data-targets="empty"' in html


def test_the_page_counts_intents_in_one_grouped_query(admin_client, unhealthy):
    admin_client.get(PAGE)  # the session and the clock are read once
    with CaptureQueriesContext(connection) as captured:
        assert admin_client.get(PAGE).status_code == 200
    intents = [q["sql"] for q in captured if Intent._meta.db_table in q["sql"]]
    assert len(intents) == 1
    assert "GROUP BY" in intents[0].upper()


def test_the_page_escapes_what_targets_carry(admin_client):
    put("webhook", "<b>x</b>", TargetHealth.HELD, seconds=60, last_error="<script>")
    html = admin_client.get(PAGE).content.decode()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "<script>" not in html.split("</head>")[1]


def test_each_row_links_to_the_intents_of_its_kind_and_target(admin_client, unhealthy):
    rows = admin_client.get(PAGE).context["rows"]
    url = rows[2].intents_url
    assert url.startswith(CHANGELIST + "?")
    response = admin_client.get(url)
    assert response.status_code == 200
    listed = [(i.kind, i.target, i.state) for i in response.context["cl"].result_list]
    assert sorted(listed) == [
        ("webhook", HOOK, "completed"),
        ("webhook", HOOK, "pending"),
        ("webhook", HOOK, "pending"),
        ("webhook", HOOK, "running"),
    ]


def test_the_changelist_filters_by_target_alone(admin_client, unhealthy):
    response = admin_client.get(CHANGELIST, {"target": HOOK})
    assert sorted(i.kind for i in response.context["cl"].result_list) == [
        "push",
        "webhook",
        "webhook",
        "webhook",
        "webhook",
    ]
    assert "By target" in response.content.decode()  # the chosen target is shown, to clear


def test_the_changelist_offers_no_target_filter_until_one_is_chosen(admin_client, unhealthy):
    html = admin_client.get(CHANGELIST).content.decode()
    assert "By target" not in html


def test_the_changelist_and_the_dashboard_link_to_the_page(admin_client):
    assert f'href="{PAGE}"' in admin_client.get(CHANGELIST).content.decode()
    assert f'href="{PAGE}"' in admin_client.get(DASHBOARD).content.decode()


def test_the_dashboard_lists_unhealthy_targets_with_counts_per_state(admin_client, unhealthy):
    response = admin_client.get(DASHBOARD)
    html = response.content.decode()
    section = html.split('id="intents-dashboard-targets"')[1].split("</section>")[0]
    assert 'data-state-count="open">1<' in section
    assert 'data-state-count="held">1<' in section
    assert section.count("<tr data-target=") == 3
    assert [listed.pending for listed in response.context["targets"]] == [0, 0, 2]


def test_the_dashboard_says_when_every_target_is_healthy(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    assert 'data-targets="empty"' in html.split('id="intents-dashboard-targets"')[1]


# -- Close now and Hold for… -----------------------------------------------------------------


def test_close_now_closes_the_target_and_says_so(admin_client, admin_user, unhealthy):
    data = {"action": "close_target", "kind": "webhook", "target": HOOK}
    response = admin_client.post(PAGE, data, follow=True)
    assert response.redirect_chain == [(PAGE, 302)]
    assert not TargetState.objects.filter(key=target_key("webhook", HOOK)).exists()
    [(level, text)] = notes(response)
    assert level == SUCCESS
    assert text.startswith("Closed target “https://partner.example/hooks/")
    assert "of kind “webhook”" in text
    entry = LogEntry.objects.get(user=admin_user)
    assert (entry.action_flag, entry.change_message) == (CHANGE, "Closed.")
    assert entry.object_id == target_key("webhook", HOOK)
    assert [r.row.target for r in response.context["rows"]] == ["device-1", "https://b.example"]


def test_hold_for_holds_the_target_for_the_seconds_given(admin_client, unhealthy):
    before = server_now()
    data = {"action": "open_target", "kind": "push", "target": "device-1", "seconds": "90"}
    response = admin_client.post(PAGE, data, follow=True)
    row = TargetState.objects.get(key=target_key("push", "device-1"))
    assert row.state == "held"
    assert before + timedelta(seconds=90) <= row.until <= server_now() + timedelta(seconds=90)
    assert row.failures == 2  # kept
    [(level, text)] = notes(response)
    assert (level, text) == (
        SUCCESS,
        "Held target “device-1” of kind “push” for 90 s: no pool claims its intents until then.",
    )
    assert LogEntry.objects.get().change_message == "Held for 90 s."


def test_hold_for_a_target_not_listed_holds_it(operator):  # noqa: F811
    data = {"action": "open_target", "kind": "webhook", "target": "new", "seconds": "1.5"}
    response = operator.post(PAGE, data)
    assert response.status_code == 302
    assert TargetState.objects.get().state == "held"


@pytest.mark.parametrize(
    ("seconds", "message"),
    [
        ("", "Hold for: “” is not a number of seconds."),
        ("soon", "Hold for: “soon” is not a number of seconds."),
        ("0", "seconds must be a positive, finite number, not 0.0"),
        ("-30", "seconds must be a positive, finite number, not -30.0"),
        ("nan", "seconds must be a positive, finite number, not nan"),
        ("1e400", "seconds must be a positive, finite number, not inf"),
    ],
)
def test_hold_for_refuses_seconds_that_are_not_a_positive_number(
    admin_client, unhealthy, seconds, message
):
    before = stored()
    data = {"action": "open_target", "kind": "push", "target": "device-1", "seconds": seconds}
    response = admin_client.post(PAGE, data, follow=True)
    assert notes(response) == [(ERROR, message)]
    assert stored() == before
    assert not LogEntry.objects.exists()


def test_a_button_for_a_blank_target_is_an_error_and_writes_nothing(admin_client, unhealthy):
    before = stored()
    response = admin_client.post(
        PAGE, {"action": "close_target", "kind": "webhook", "target": " "}, follow=True
    )
    assert notes(response) == [(ERROR, "target must not be blank (only whitespace)")]
    assert stored() == before


def test_close_now_on_a_healthy_target_says_nothing_changed(admin_client, unhealthy):
    before = stored()
    response = admin_client.post(
        PAGE, {"action": "close_target", "kind": "webhook", "target": "gone"}, follow=True
    )
    assert notes(response) == [(WARNING, "Target “gone” of kind “webhook” was already healthy.")]
    assert stored() == before


def test_buttons_require_the_csrf_token(admin_user, unhealthy):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    before = stored()
    data = {"action": "close_target", "kind": "webhook", "target": HOOK}
    assert client.post(PAGE, data).status_code == 403
    assert stored() == before
    table = client.get(PAGE).content.decode().split('class="intents-targets-table"')[1]
    assert table.count('name="csrfmiddlewaretoken"') == 2 * 3  # two forms a row


def test_a_forged_action_is_refused(admin_client, unhealthy):
    before = stored()
    assert admin_client.post(PAGE, {"action": "delete", "kind": "webhook"}).status_code == 403
    assert stored() == before


# -- who may do what -------------------------------------------------------------------------


def test_view_only_staff_sees_the_page_without_buttons(viewer, unhealthy):  # noqa: F811
    response = viewer.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Close now" not in html and "Hold for" not in html


def test_view_only_staff_cannot_post_a_button(viewer, unhealthy):  # noqa: F811
    before = stored()
    data = {"action": "close_target", "kind": "webhook", "target": HOOK}
    assert viewer.post(PAGE, data).status_code == 403
    assert stored() == before


def test_the_page_needs_the_view_permission(client, django_user_model, unhealthy):
    assert client.get(PAGE).status_code == 302  # anonymous: to the login page
    client.force_login(staff(django_user_model))
    assert client.get(PAGE).status_code == 403


def test_operator_with_change_permission_sees_and_uses_the_buttons(operator, unhealthy):  # noqa: F811
    assert "Close now" in operator.get(PAGE).content.decode()
    data = {"action": "close_target", "kind": "push", "target": "device-1"}
    assert operator.post(PAGE, data).status_code == 302
    assert not TargetState.objects.filter(key=target_key("push", "device-1")).exists()


def test_the_page_lists_the_first_targets_and_counts_the_rest(admin_client, unhealthy, monkeypatch):
    monkeypatch.setattr(targets_page, "LISTED", 2)
    response = admin_client.get(PAGE)
    assert len(response.context["rows"]) == 2
    html = response.content.decode()
    assert 'data-targets="more">and 1 more target not listed here<' in html
