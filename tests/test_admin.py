"""The Intent admin through Django's test client: list, filters, search, pages, actions, buttons.

Every test that acts checks the rows afterwards, and every refusal checks that
nothing changed (``snapshot()``), because a message is not proof of a transition.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.contrib.messages.constants import SUCCESS, WARNING
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_intents.admin.actions import skipped_message
from django_intents.admin.humanize import relative, short_duration
from django_intents.admin.summary import queue_summary
from django_intents.models import Intent
from django_intents.store.clock import server_now

from .conftest import T0, external_kinds, row, snapshot

pytestmark = pytest.mark.django_db

TARGET = "https://partner.example/hooks"
CHANGELIST = reverse("admin:django_intents_intent_changelist")
# list_display index as the changelist's ?o= counts it: 0 is the action checkbox.
NEXT_RUN_COLUMN = 7
PRIORITY_COLUMN = 6
CONFIRMED = ("cancel",)  # transitions that ask on a page of their own first


def make(
    state: str = "pending",
    *,
    kind: str = "webhook",
    event: str = "order-1-paid",
    target: str = TARGET,
    payload: Any = None,
    next_in: float = 0,
    lease_in: float = 30,
    error: str = "",
    created: datetime | None = None,
) -> str:
    """Store one intent in ``state``, times relative to the real clock (the admin reads it)."""
    now = timezone.now()
    id = Intent.objects.enqueue(
        kind,
        event,
        target,
        payload,
        next_at=now + timedelta(seconds=next_in),
        now=created or now,
    )
    fields: dict[str, Any] = {"state": state, "last_error": error}
    if state == Intent.State.RUNNING:
        fields |= {
            "attempts": 1,
            "claim_token": "c" * 32,
            "claim_until": now + timedelta(seconds=lease_in),
        }
    elif state != Intent.State.PENDING:
        fields |= {"attempts": 1}
    Intent.objects.filter(pk=id).update(**fields)
    return id


def change_url(id: str) -> str:  # noqa: A002
    return reverse("admin:django_intents_intent_change", args=[id])


def button_url(name: str, id: str) -> str:  # noqa: A002
    return reverse(f"admin:django_intents_intent_{name}", args=[id])


def act(client: Client, action: str, ids: list[str], *, confirmed: bool = True) -> Any:
    """Run ``action`` on ``ids`` from the list; ``confirmed``: as the "Yes, I'm sure" of a
    transition that asks first (cancel) posts it."""
    data = {"action": action, "_selected_action": ids, "index": "0"}
    if confirmed and action in CONFIRMED:
        data["post"] = "yes"
    return client.post(CHANGELIST, data)


def notes(response: Any) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def listed(response: Any) -> list[str]:
    return [intent.pk for intent in response.context["cl"].result_list]


def staff(django_user_model: Any, *codenames: str) -> Any:
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_intents", codename__in=codenames)
    )
    return user


@pytest.fixture
def viewer(client: Client, django_user_model: Any) -> Client:
    client.force_login(staff(django_user_model, "view_intent"))
    return client


@pytest.fixture
def operator(client: Client, django_user_model: Any) -> Client:
    """Staff who may view and change intents, but not delete them."""
    client.force_login(staff(django_user_model, "view_intent", "change_intent"))
    return client


@pytest.fixture
def mixed() -> dict[str, str]:
    """One intent per state, the pending one waiting for a future retry."""
    return {
        "pending": make("pending", event="e-pending", next_in=600, error="HTTP 502"),
        "running": make("running", event="e-running"),
        "completed": make("completed", event="e-completed"),
        "cancelled": make("cancelled", event="e-cancelled", error="gone"),
    }


# -- helpers shown in the list --------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "now"),
        (45, "in 45 s"),
        (180, "in 3 min"),
        (-120, "2 min ago"),
        (7200, "in 2 h"),
        (-3 * 86400, "3 d ago"),
    ],
)
def test_relative_reads_like_a_person(seconds, text):
    assert relative(T0 + timedelta(seconds=seconds), T0) == text


def test_short_duration_rounds_instead_of_truncating():
    assert short_duration(179.9) == "3 min"


# -- changelist -------------------------------------------------------------------


def test_changelist_shows_every_column(admin_client):
    id = make(
        "pending",
        event="e1",
        next_in=180,
        error="connection refused by partner.example " + "x" * 200 + "\nsecond line",
    )
    Intent.objects.filter(pk=id).update(attempts=3)
    late = make("pending", kind="push", event="e2", next_in=-120)
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'title="{id}">{id[:12]}</span>' in html
    assert f">{late[:12]}</span>" in html
    assert '<span class="intents-state intents-state-pending">Pending</span>' in html
    assert '<td class="field-attempts">3</td>' in html
    assert ">in 3 min</span>" in html
    assert ">2 min ago</span>" in html
    assert '<td class="field-kind">push</td>' in html
    shown = re.search(r'<span class="intents-error" title="[^"]*">([^<]*)</span>', html)
    assert shown is not None
    assert shown.group(1).startswith("connection refused by partner.example xxx")
    assert shown.group(1).endswith("…")
    assert len(shown.group(1)) == 80
    assert "second line" not in shown.group(1)


@external_kinds("<b>kind</b>")
def test_changelist_escapes_what_intents_carry(admin_client):
    make("pending", kind="<b>kind</b>", event="e", error="<script>alert(1)</script>")
    html = admin_client.get(CHANGELIST).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>kind</b>" not in html


def test_changelist_next_run_of_running_and_finished_intents(admin_client):
    make("running", event="r", lease_in=20)
    make("running", event="x", lease_in=-300)
    make("completed", event="c")
    html = admin_client.get(CHANGELIST).content.decode()
    assert re.search(r">lease ends in (19|20) s</span>", html)  # a second may pass
    assert ">lease expired 5 min ago</span>" in html
    assert '<td class="field-next_run">-</td>' in html


def test_changelist_is_newest_first(admin_client):
    now = timezone.now()
    ids = [make(event=f"e{i}", created=now - timedelta(minutes=10 - i)) for i in range(3)]
    assert listed(admin_client.get(CHANGELIST)) == ids[::-1]


def test_next_run_column_sorts_in_claim_order(admin_client):
    now = timezone.now()
    # Same next_at: the claim breaks the tie by created_at, then id.
    later = make(event="a", next_in=60)
    tie_new = make(event="b", next_in=0, created=now - timedelta(minutes=1))
    tie_old = make(event="c", next_in=0, created=now - timedelta(minutes=2))
    Intent.objects.filter(pk__in=[tie_new, tie_old]).update(next_at=now)
    expected = list(Intent.objects.pending().values_list("pk", flat=True))
    assert expected == [tie_old, tie_new, later]
    assert listed(admin_client.get(CHANGELIST, {"o": str(NEXT_RUN_COLUMN)})) == expected
    assert listed(admin_client.get(CHANGELIST, {"o": f"-{NEXT_RUN_COLUMN}"})) == expected[::-1]


def test_priority_column_sorts_in_claim_order_when_descending(admin_client):
    now = timezone.now()
    low = make(event="low", next_in=0)
    high_later = make(event="high-later", next_in=60)
    high_sooner = make(event="high-sooner", next_in=30)
    Intent.objects.filter(pk=low).update(priority=-5)
    Intent.objects.filter(pk__in=[high_later, high_sooner]).update(priority=5)
    plain = make(event="plain", next_in=0, created=now - timedelta(minutes=1))
    expected = list(Intent.objects.pending().values_list("pk", flat=True))
    assert expected == [high_sooner, high_later, plain, low]
    assert listed(admin_client.get(CHANGELIST, {"o": f"-{PRIORITY_COLUMN}"})) == expected
    assert listed(admin_client.get(CHANGELIST, {"o": str(PRIORITY_COLUMN)})) == expected[::-1]


def test_changelist_filters_by_state(admin_client, mixed):
    response = admin_client.get(CHANGELIST, {"state__exact": "running"})
    assert listed(response) == [mixed["running"]]


def test_changelist_filters_by_kind(admin_client, mixed):
    push = make(kind="push", event="p")
    assert listed(admin_client.get(CHANGELIST, {"kind": "push"})) == [push]


def test_changelist_filters_failing_intents(admin_client, mixed):
    response = admin_client.get(CHANGELIST, {"state__exact": "pending", "error": "yes"})
    assert listed(response) == [mixed["pending"]]
    clean = listed(admin_client.get(CHANGELIST, {"error": "no"}))
    assert sorted(clean) == sorted([mixed["running"], mixed["completed"]])


def test_search_finds_by_id_prefix(admin_client, mixed):
    assert listed(admin_client.get(CHANGELIST, {"q": mixed["running"][:12]})) == [mixed["running"]]


def test_search_finds_by_event_id(admin_client, mixed):
    assert listed(admin_client.get(CHANGELIST, {"q": "e-cancelled"})) == [mixed["cancelled"]]


def test_search_finds_by_target(admin_client, mixed):
    other = make(event="e-pending", target="https://other.example/in")
    assert listed(admin_client.get(CHANGELIST, {"q": "other.example"})) == [other]


# -- summary ------------------------------------------------------------------------


def test_summary_counts_states_and_due_per_kind():
    now = T0
    Intent.objects.enqueue("webhook", "a", TARGET, now=now - timedelta(minutes=7))
    Intent.objects.enqueue("webhook", "b", TARGET, now=now - timedelta(minutes=2))
    Intent.objects.enqueue("webhook", "later", TARGET, next_at=now + timedelta(hours=1), now=now)
    Intent.objects.enqueue("push", "p", TARGET, now=now - timedelta(minutes=40))
    # A running push intent whose lease expired 30 minutes ago is due since then.
    claimed = Intent.objects.claim(now=now - timedelta(minutes=31), kinds=["push"], lease=60)
    Intent.objects.enqueue("job", "done", TARGET, now=now - timedelta(days=1))
    job = Intent.objects.claim(now=now - timedelta(days=1), kinds=["job"])
    Intent.objects.complete(job.pk, job.claim_token, now=now - timedelta(days=1))
    summary = queue_summary(now)
    assert {s.value: s.count for s in summary.states} == {
        "pending": 3,
        "running": 1,
        "completed": 1,
        "cancelled": 0,
    }
    kinds = {k.kind: (k.active, k.due, k.oldest_due_age) for k in summary.kinds}
    assert kinds == {
        "push": (1, 1, now - claimed.claim_until),
        "webhook": (3, 2, timedelta(minutes=7)),
    }
    assert claimed.claim_until == now - timedelta(minutes=30)
    assert summary.due == 3
    assert summary.oldest_due_age == timedelta(minutes=30)
    assert summary.waiting == "30 min"


@external_kinds(*(f"k{i}" for i in range(7)))
def test_summary_queries_do_not_grow_with_rows_or_kinds():
    def count() -> int:
        server_now()  # a fresh reading of the clock: none is taken while counting
        with CaptureQueriesContext(connection) as queries:
            queue_summary(T0 + timedelta(minutes=1))
        return len(queries)

    Intent.objects.enqueue("webhook", "e0", TARGET, now=T0)
    few = count()
    for i in range(40):
        Intent.objects.enqueue(f"k{i % 7}", f"e{i}", TARGET, now=T0)
    Intent.objects.filter(event_id__endswith="3").update(state="completed")
    # The kinds, whether the backlog is small, the backlog, and a bounded count per
    # finished state.
    assert count() == few == 5


@external_kinds(*(f"k{i}" for i in range(7)))
def test_changelist_queries_do_not_grow_with_rows_or_kinds(admin_client):
    def count() -> int:
        server_now()  # a fresh reading of the clock: none is taken while counting
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(CHANGELIST).status_code == 200
        return len(queries)

    make(event="first")
    few = count()
    for i in range(30):
        make(
            ("pending", "running", "completed", "cancelled")[i % 4], kind=f"k{i % 7}", event=f"e{i}"
        )
    assert count() == few


def test_changelist_shows_the_summary(admin_client, mixed):
    make("pending", kind="push", event="late", next_in=-300)
    html = admin_client.get(CHANGELIST).content.decode()
    assert "Queue summary" in html
    for state, count in {"pending": 2, "running": 1, "completed": 1, "cancelled": 1}.items():
        assert f'<strong class="intents-count" data-state="{state}">{count}</strong>' in html
    assert '<strong data-summary="due">1</strong>' in html
    assert '<strong data-summary="oldest">5 min</strong>' in html
    push = re.search(r'<tr data-kind="push">(.*?)</tr>', html, re.S)
    assert push is not None
    assert re.findall(r"<td>([^<]*)</td>", push.group(1)) == ["1", "1", "5 min"]


def test_summary_counts_everything_whatever_the_filter(admin_client, mixed):
    html = admin_client.get(CHANGELIST, {"state__exact": "running"}).content.decode()
    assert '<strong class="intents-count" data-state="completed">1</strong>' in html


# -- change page ------------------------------------------------------------------------


def test_change_page_shows_payload_pretty_and_escaped(admin_client):
    id = make(payload={"html": "<script>alert(1)</script>", "n": [1, 2]}, error="boom\nline 2")
    html = admin_client.get(change_url(id)).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert (
        '<pre class="intents-pre">{\n  &quot;html&quot;: &quot;&lt;script&gt;alert(1)'
        "&lt;/script&gt;&quot;,\n  &quot;n&quot;: [\n    1,\n    2\n  ]\n}</pre>"
    ) in html
    assert '<pre class="intents-pre">boom\nline 2</pre>' in html


def test_change_page_is_read_only(admin_client):
    id = make("running", payload={"a": 1})
    response = admin_client.get(change_url(id))
    html = response.content.decode()
    assert response.status_code == 200
    assert response.context["adminform"].form.fields == {}
    assert "c" * 32 in html  # the claim token, shown as text
    for name in ("_save", "_continue", "_addanother", 'name="payload"', 'name="state"'):
        assert name not in html


def test_change_page_refuses_a_posted_form(admin_client):
    id = make("running", payload={"a": 1})
    before = snapshot()
    response = admin_client.post(change_url(id), {"state": "completed", "_save": "Save"})
    assert response.status_code == 403
    assert snapshot() == before


def test_intents_cannot_be_added(admin_client):
    add = reverse("admin:django_intents_intent_add")
    assert admin_client.get(add).status_code == 403
    assert admin_client.post(add, {"kind": "webhook"}).status_code == 403
    assert Intent.objects.count() == 0
    assert add not in admin_client.get(CHANGELIST).content.decode()


# -- actions --------------------------------------------------------------------------------


def test_retry_now_action_makes_unfinished_intents_due_and_skips_finished_ones(
    admin_client, admin_user, mixed
):
    finished = {
        mixed["completed"]: row(mixed["completed"]),
        mixed["cancelled"]: row(mixed["cancelled"]),
    }
    before = server_now()
    response = act(admin_client, "retry_now", list(mixed.values()))
    after = server_now()
    assert response.status_code == 302
    for key in ("pending", "running"):
        intent = row(mixed[key])
        assert intent.state == "pending"
        assert before <= intent.next_at <= after
        assert (intent.claim_token, intent.claim_until) == ("", None)
    for id, was in finished.items():
        assert list(Intent.objects.filter(pk=id).values_list()) == [
            tuple(getattr(was, f.attname) for f in Intent._meta.concrete_fields)
        ]
    assert notes(response) == [
        (SUCCESS, "Scheduled 2 intents to run now."),
        (WARNING, "Skipped 2 intents: 1 already completed, 1 already cancelled."),
    ]
    logged = LogEntry.objects.filter(user=admin_user, action_flag=CHANGE)
    assert sorted(logged.values_list("object_id", flat=True)) == sorted(
        [mixed["pending"], mixed["running"]]
    )
    assert set(logged.values_list("change_message", flat=True)) == {"Retried now."}


def test_retry_now_action_fences_the_running_claimant(admin_client, mixed):
    act(admin_client, "retry_now", [mixed["running"]])
    assert Intent.objects.complete(mixed["running"], "c" * 32) is False
    assert row(mixed["running"]).state == "pending"


def test_cancel_action_cancels_unfinished_intents_and_skips_finished_ones(admin_client, mixed):
    before = snapshot()
    response = act(admin_client, "cancel", list(mixed.values()))
    assert response.status_code == 302
    for key in ("pending", "running"):
        intent = row(mixed[key])
        assert intent.state == "cancelled"
        assert (intent.claim_token, intent.claim_until) == ("", None)
    assert Intent.objects.complete(mixed["running"], "c" * 32) is False
    untouched = [r for r in before if r[0] in (mixed["completed"], mixed["cancelled"])]
    assert [r for r in snapshot() if r[0] in (mixed["completed"], mixed["cancelled"])] == untouched
    assert notes(response) == [
        (SUCCESS, "Cancelled 2 intents."),
        (WARNING, "Skipped 2 intents: 1 already completed, 1 already cancelled."),
    ]


def test_action_messages_use_the_singular(admin_client, mixed):
    response = act(admin_client, "cancel", [mixed["pending"], mixed["completed"]])
    assert notes(response) == [
        (SUCCESS, "Cancelled 1 intent."),
        (WARNING, "Skipped 1 intent: 1 already completed."),
    ]
    assert row(mixed["pending"]).state == "cancelled"
    assert row(mixed["completed"]).state == "completed"


def test_action_on_finished_intents_only_says_why_nothing_changed(admin_client, mixed):
    before = snapshot()
    response = act(admin_client, "retry_now", [mixed["cancelled"]])
    assert notes(response) == [(WARNING, "Skipped 1 intent: 1 already cancelled.")]
    assert snapshot() == before


def test_actions_apply_to_all_matching_intents_across_pages(admin_client, mixed):
    response = admin_client.post(
        CHANGELIST + "?state__exact=pending",
        {
            "action": "cancel",
            "_selected_action": [mixed["pending"]],
            "select_across": "1",
            "index": "0",
            "post": "yes",
        },
    )
    assert notes(response) == [(SUCCESS, "Cancelled 1 intent.")]
    assert row(mixed["pending"]).state == "cancelled"
    assert row(mixed["running"]).state == "running"


def test_operator_with_change_permission_can_act(operator, mixed):
    response = act(operator, "cancel", [mixed["running"]])
    assert notes(response) == [(SUCCESS, "Cancelled 1 intent.")]
    assert row(mixed["running"]).state == "cancelled"


def test_unknown_action_is_refused(admin_client, mixed):
    before = snapshot()
    assert act(admin_client, "drop_everything", [mixed["pending"]]).status_code == 403
    assert snapshot() == before


def test_skipped_message_says_why_for_intents_that_moved_or_went_meanwhile(mixed):
    # An intent can finish, or be deleted, between the selection and the action.
    ids = [mixed["completed"], mixed["pending"], "0" * 64, "1" * 64]
    assert skipped_message(ids) == (
        "Skipped 4 intents: 1 already completed, 1 changed meanwhile, 2 no longer exist."
    )
    assert skipped_message(["0" * 64]) == "Skipped 1 intent: 1 no longer exists."


# -- buttons on the change page ------------------------------------------------------------


def test_change_page_of_an_unfinished_intent_has_both_buttons(admin_client, mixed):
    html = admin_client.get(change_url(mixed["running"])).content.decode()
    for name, label in (("retry_now", "Retry now"), ("cancel", "Cancel intent")):
        form = re.search(
            rf'<form method="post" action="{re.escape(button_url(name, mixed["running"]))}"[^>]*>'
            r"(.*?)</form>",
            html,
            re.S,
        )
        assert form is not None
        assert 'name="csrfmiddlewaretoken"' in form.group(1)
        assert f">{label}</button>" in form.group(1)


def test_change_page_of_a_finished_intent_has_no_buttons(admin_client, mixed):
    html = admin_client.get(change_url(mixed["completed"])).content.decode()
    assert "intents-button" not in html


def test_change_page_of_a_finished_intent_shows_no_next_run(admin_client, mixed):
    for key in ("completed", "cancelled"):
        html = admin_client.get(change_url(mixed[key])).content.decode()
        assert "field-next_at" not in html
        shown = re.search(r'field-next_run">.*?<div class="readonly">(.*?)</div>', html, re.S)
        assert shown is not None and shown.group(1) == "-"
    assert "field-next_at" in admin_client.get(change_url(mixed["pending"])).content.decode()


def test_retry_now_button(admin_client, mixed):
    before = server_now()
    response = admin_client.post(button_url("retry_now", mixed["running"]))
    assert response.status_code == 302
    assert response["Location"] == change_url(mixed["running"])
    intent = row(mixed["running"])
    assert intent.state == "pending"
    assert intent.next_at >= before
    assert intent.claim_token == ""
    assert notes(response) == [(SUCCESS, "Scheduled 1 intent to run now.")]


def test_cancel_button(admin_client, mixed):
    response = admin_client.post(button_url("cancel", mixed["pending"]), {"post": "yes"})
    assert response.status_code == 302
    assert row(mixed["pending"]).state == "cancelled"
    assert notes(response) == [(SUCCESS, "Cancelled 1 intent.")]


def test_cancel_action_asks_first_and_changes_nothing_until_confirmed(admin_client, mixed):
    before = snapshot()
    selection = [mixed["pending"], mixed["running"]]
    response = act(admin_client, "cancel", selection, confirmed=False)
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_intents/intent/confirm_transition.html"
    html = response.content.decode()
    assert "Yes, I’m sure" in html
    assert '<input type="hidden" name="post" value="yes">' in html
    assert '<input type="hidden" name="action" value="cancel">' in html
    for id in selection:
        assert f'<input type="hidden" name="_selected_action" value="{id}">' in html
        assert f'title="{id}"' in html  # listed, the full id on hover
    assert mixed["completed"] not in html
    assert notes(response) == []
    assert snapshot() == before
    # The page's form posts the selection back with post=yes.
    confirmed = admin_client.post(
        CHANGELIST, {"action": "cancel", "_selected_action": selection, "post": "yes"}
    )
    assert confirmed.status_code == 302
    assert notes(confirmed) == [(SUCCESS, "Cancelled 2 intents.")]
    for id in selection:
        assert row(id).state == "cancelled"


def test_cancel_confirmation_across_pages_posts_the_filter_back(admin_client, mixed):
    before = snapshot()
    url = CHANGELIST + "?state__exact=pending"
    data = {
        "action": "cancel",
        "_selected_action": [mixed["pending"]],
        "select_across": "1",
        "index": "0",
    }
    response = admin_client.post(url, data)
    html = response.content.decode()
    assert '<input type="hidden" name="select_across" value="1">' in html
    assert "1 intent selected" in html
    assert snapshot() == before
    response = admin_client.post(url, {**data, "post": "yes"})
    assert notes(response) == [(SUCCESS, "Cancelled 1 intent.")]
    assert row(mixed["pending"]).state == "cancelled"
    assert row(mixed["running"]).state == "running"


def test_cancel_button_asks_first_and_changes_nothing_until_confirmed(admin_client, mixed):
    before = snapshot()
    url = button_url("cancel", mixed["running"])
    response = admin_client.post(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<form method="post">' in html  # back to the button's URL
    assert '<input type="hidden" name="post" value="yes">' in html
    assert f'title="{mixed["running"]}"' in html
    assert snapshot() == before
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert row(mixed["running"]).state == "cancelled"
    assert notes(response) == [(SUCCESS, "Cancelled 1 intent.")]


@external_kinds("<b>kind</b>")
def test_cancel_confirmation_escapes_what_intents_carry(admin_client):
    id = make(kind="<b>kind</b>", target='https://x.example/"><script>alert(1)</script>')
    html = act(admin_client, "cancel", [id], confirmed=False).content.decode()
    assert "<script>" not in html and "<b>kind</b>" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;kind&lt;/b&gt;" in html


def test_retry_now_asks_nothing(admin_client, mixed):
    response = act(admin_client, "retry_now", [mixed["running"]], confirmed=False)
    assert response.status_code == 302
    assert row(mixed["running"]).state == "pending"


@pytest.mark.parametrize("confirmed", [False, True])
def test_cancel_confirmation_requires_the_change_permission(viewer, mixed, confirmed):
    before = snapshot()
    assert act(viewer, "cancel", [mixed["pending"]], confirmed=confirmed).status_code == 403
    data = {"post": "yes"} if confirmed else {}
    assert viewer.post(button_url("cancel", mixed["pending"]), data).status_code == 403
    assert snapshot() == before


def test_button_on_a_finished_intent_changes_nothing(admin_client, mixed):
    before = snapshot()
    response = admin_client.post(button_url("retry_now", mixed["completed"]))
    assert response.status_code == 302
    assert notes(response) == [(WARNING, "Skipped 1 intent: 1 already completed.")]
    assert snapshot() == before


def test_button_on_a_missing_intent(admin_client):
    response = admin_client.post(button_url("cancel", "f" * 64))
    assert response.status_code == 302
    assert response["Location"] == CHANGELIST
    assert notes(response) == [
        (WARNING, f"There is no intent with id “{'f' * 64}”; perhaps it was deleted.")
    ]


def test_buttons_refuse_get(admin_client, mixed):
    before = snapshot()
    assert admin_client.get(button_url("cancel", mixed["pending"])).status_code == 405
    assert snapshot() == before


def test_buttons_require_the_csrf_token(admin_user, mixed):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    before = snapshot()
    assert client.post(button_url("cancel", mixed["pending"])).status_code == 403
    assert snapshot() == before


# -- who may do what ------------------------------------------------------------------------


def test_view_only_staff_sees_intents_but_no_actions(viewer, mixed):
    response = viewer.get(CHANGELIST)
    assert response.status_code == 200
    assert sorted(listed(response)) == sorted(mixed.values())
    assert response.context["action_form"] is None
    html = response.content.decode()
    assert "Retry now" not in html
    assert 'name="_selected_action"' not in html


def test_view_only_staff_sees_no_buttons(viewer, mixed):
    response = viewer.get(change_url(mixed["running"]))
    assert response.status_code == 200
    assert "intents-button" not in response.content.decode()


@pytest.mark.parametrize("action", ["retry_now", "cancel", "delete_selected"])
def test_view_only_staff_cannot_forge_an_action(viewer, mixed, action):
    before = snapshot()
    assert act(viewer, action, list(mixed.values())).status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("name", ["retry_now", "cancel"])
def test_view_only_staff_cannot_forge_a_button(viewer, mixed, name):
    before = snapshot()
    assert viewer.post(button_url(name, mixed["running"]), {"post": "yes"}).status_code == 403
    assert snapshot() == before


def test_anonymous_is_sent_to_the_login_page(client, mixed):
    before = snapshot()
    for response in (
        client.get(CHANGELIST),
        client.get(change_url(mixed["pending"])),
        act(client, "cancel", list(mixed.values())),
        client.post(button_url("retry_now", mixed["running"])),
    ):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    assert snapshot() == before


# -- deletion -------------------------------------------------------------------------------


def test_finished_intent_can_be_deleted(admin_client, mixed):
    url = reverse("admin:django_intents_intent_delete", args=[mixed["completed"]])
    assert admin_client.get(url).status_code == 200
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Intent.objects.filter(pk=mixed["completed"]).exists()


def test_unfinished_intent_cannot_be_deleted(admin_client, mixed):
    before = snapshot()
    for key in ("pending", "running"):
        url = reverse("admin:django_intents_intent_delete", args=[mixed[key]])
        assert admin_client.get(url).status_code == 403
        assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert snapshot() == before
    html = admin_client.get(change_url(mixed["pending"])).content.decode()
    assert "deletelink" not in html


def test_bulk_delete_confirms_only_finished_intents(admin_client, mixed):
    response = act(admin_client, "delete_selected", list(mixed.values()))
    assert response.status_code == 200
    confirm = sorted(response.context["queryset"].values_list("pk", flat=True))
    assert confirm == sorted([mixed["completed"], mixed["cancelled"]])
    assert notes(response) == [
        (
            WARNING,
            "Skipped 2 intents that are still pending or running: "
            "only completed and cancelled intents can be deleted.",
        )
    ]
    assert Intent.objects.count() == 4


def test_bulk_delete_deletes_finished_and_keeps_unfinished(admin_client, mixed):
    response = admin_client.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": list(mixed.values()), "post": "yes"},
    )
    assert response.status_code == 302
    assert sorted(Intent.objects.values_list("pk", flat=True)) == sorted(
        [mixed["pending"], mixed["running"]]
    )
    assert (SUCCESS, "Successfully deleted 2 intents.") in notes(response)


def test_bulk_delete_of_only_unfinished_intents_deletes_nothing(admin_client, mixed):
    before = snapshot()
    response = act(admin_client, "delete_selected", [mixed["pending"], mixed["running"]])
    assert response.status_code == 302
    assert snapshot() == before


def test_operator_without_delete_permission_cannot_delete(operator, mixed):
    before = snapshot()
    assert act(operator, "delete_selected", [mixed["completed"]]).status_code == 403
    url = reverse("admin:django_intents_intent_delete", args=[mixed["completed"]])
    assert operator.post(url, {"post": "yes"}).status_code == 403
    assert snapshot() == before
