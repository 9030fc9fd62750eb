"""The admin's list on a big table: what each page costs follows what it shows.

Counts are exact up to ``admin_list.EXACT`` rows and the planner's estimate
past it (labelled "about" and "≈"); these tests lower ``EXACT`` to reach the
estimates with a few rows. Kinds come from an index, search tries the indexed
lookups first, and an action on a selection runs a fixed number of statements.
The figures on 5,000,000 rows are in docs/benchmarks.md ("The admin on a big
table"), from ``bench/admin_bench.py``.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_intents.admin import IntentAdmin
from django_intents.admin import changelist as admin_list
from django_intents.admin.summary import queue_summary
from django_intents.models import Intent
from django_intents.store.clock import server_now

from .conftest import external_kinds, row, snapshot
from .test_admin import CHANGELIST, act, listed, make, notes

pytestmark = pytest.mark.django_db


@pytest.fixture
def exact_up_to_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_list, "EXACT", 3)


def analyze() -> None:
    """Fresh statistics on PostgreSQL, as autovacuum keeps them on a real table. (InnoDB
    estimates from the index as it is; its ANALYZE TABLE would commit the test's rows.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(Intent._meta.db_table)}")


# -- counts -------------------------------------------------------------------------


def test_counts_up_to_the_bound_are_exact_and_unlabelled(admin_client, exact_up_to_3):
    for i in range(3):
        make(event=f"e{i}")
    response = admin_client.get(CHANGELIST)
    assert response.context["cl"].result_count == 3
    assert response.context["cl"].paginator.exact
    assert "intents-estimate" not in response.content.decode()


def test_counts_past_the_bound_are_estimates_labelled_as_such(admin_client, exact_up_to_3):
    for i in range(12):
        make("completed", event=f"e{i}")
    analyze()
    response = admin_client.get(CHANGELIST)
    html = response.content.decode()
    cl = response.context["cl"]
    if connection.vendor == "sqlite":  # no estimates: the exact count, unlabelled
        assert (cl.result_count, cl.paginator.exact) == (12, True)
        assert "intents-estimate" not in html
        return
    assert not cl.paginator.exact
    assert cl.result_count >= 4  # never below what the bounded count saw
    assert f'data-estimate="{cl.result_count}">About ' in html
    assert re.search(r"About [\d,.\s]+ intents: an estimate", html)
    assert '<span class="intents-estimate"' in html  # the summary's ≈ on "completed"
    assert len(listed(response)) == 12  # the page itself is exact


def test_summary_counts_finished_states_exactly_up_to_the_bound(exact_up_to_3):
    for i in range(3):
        make("completed", event=f"c{i}")
    make("cancelled", event="x")
    states = {s.value: (s.count, s.exact) for s in queue_summary().states}
    assert states["completed"] == (3, True)
    assert states["cancelled"] == (1, True)


def test_summary_estimates_finished_states_past_the_bound(exact_up_to_3):
    for i in range(20):
        make("completed", event=f"c{i}")
    make("pending", event="p")
    analyze()
    states = {s.value: (s.count, s.exact) for s in queue_summary().states}
    assert states["pending"] == (1, True)  # unfinished intents are always counted exactly
    count, exact = states["completed"]
    if connection.vendor == "sqlite":
        assert (count, exact) == (20, True)
    else:
        assert not exact and count >= 4


@external_kinds("push")
def test_a_big_backlog_is_estimated_per_kind_with_exact_running_and_oldest_due(
    admin_client, exact_up_to_3
):
    now = server_now()
    late = [make(event=f"late{i}", next_in=-600 + i) for i in range(3)]
    for i in range(3):
        make(event=f"later{i}", next_in=600)
    stuck = make("running", kind="push", event="stuck", lease_in=-120)
    make("running", kind="push", event="live", lease_in=60)
    make("pending", kind="push", event="p", next_in=-30)
    analyze()
    summary = queue_summary(now)
    states = {s.value: (s.count, s.exact) for s in summary.states}
    kinds = {k.kind: k for k in summary.kinds}
    assert states["running"] == (2, True)  # running intents are always counted exactly
    webhook, push = kinds["webhook"], kinds["push"]
    assert webhook.oldest_due_age == now - row(late[0]).next_at  # exact, estimates or not
    assert push.oldest_due_age == now - row(stuck).claim_until
    if connection.vendor == "sqlite":  # no estimates: the exact backlog
        assert (webhook.active, webhook.due, webhook.exact) == (6, 3, True)
        assert (push.active, push.due, push.exact) == (3, 2, True)
        assert states["pending"] == (7, True)
        return
    assert not (webhook.exact or push.exact or summary.exact)
    assert states["pending"][1] is False
    assert push.due >= 1  # the expired lease, counted exactly, plus the estimate
    html = admin_client.get(CHANGELIST).content.decode()
    cells = re.search(r'<tr data-kind="webhook">(.*?)</tr>', html, re.S).group(1)
    assert cells.count('class="intents-estimate"') == 2  # active and due


@pytest.mark.parametrize("query", [{}, {"state__exact": "pending"}, {"o": "-7"}])
def test_deep_pages_found_by_their_ids_first_list_what_plain_pages_do(
    admin_client, monkeypatch, query
):
    monkeypatch.setattr(IntentAdmin, "list_per_page", 3)
    now = server_now()
    for i in range(11):
        make("pending" if i % 3 else "completed", event=f"e{i}", created=now, next_in=i % 4)

    def pages() -> list[list[str]]:
        return [listed(admin_client.get(CHANGELIST, {**query, "p": p})) for p in (1, 2, 3)]

    plain = pages()
    monkeypatch.setattr(admin_list, "DEFERRED_FROM", 3)  # from page 2 on
    with CaptureQueriesContext(connection) as captured:
        deferred = pages()
    assert deferred == plain
    assert sum(len(page) for page in plain) == len(set(sum(plain, [])))  # no row twice
    assert any(" IN (" in q["sql"] and "LIMIT 3 OFFSET 3" not in q["sql"] for q in captured)


# -- the kind filter ---------------------------------------------------------------------


@external_kinds("push", "zeta", "old.kind")
def test_kind_filter_lists_every_kind_in_the_table_finished_ones_too(admin_client):
    make(kind="push", event="p")
    make(kind="zeta", event="z")
    make("completed", kind="old.kind", event="o")
    make(event="w")
    spec = next(
        f for f in admin_client.get(CHANGELIST).context["cl"].filter_specs if f.title == "kind"
    )
    assert [value for value, _ in spec.lookup_choices] == ["old.kind", "push", "webhook", "zeta"]


@external_kinds(*(f"k{i}" for i in range(6)))
def test_kind_filter_costs_one_query_however_many_kinds(admin_client):
    def queries() -> int:
        server_now()  # a fresh reading of the clock: none is taken while counting
        with CaptureQueriesContext(connection) as captured:
            admin_client.get(CHANGELIST, {"kind": "k0"})
        return len(captured)

    make(kind="k0", event="a")
    few = queries()
    for i in range(30):
        make(kind=f"k{i % 6}", event=f"e{i}")
    assert queries() == few


# -- search -----------------------------------------------------------------------------


@external_kinds("push")
def test_search_by_event_id_finds_it_in_every_kind_and_state(admin_client):
    a = make(event="order-7")
    b = make("completed", kind="push", event="order-7")
    make(event="order-77")
    assert sorted(listed(admin_client.get(CHANGELIST, {"q": "order-7"}))) == sorted([a, b])


def test_search_by_an_exact_event_id_leaves_out_those_that_only_contain_it(admin_client):
    exact = make(event="abc")
    make(event="xabcx")
    assert listed(admin_client.get(CHANGELIST, {"q": "abc"})) == [exact]


def test_search_by_text_inside_event_ids_when_nothing_matches_exactly(admin_client):
    inside = make(event="order-42-paid")
    make(event="order-43-paid")
    assert listed(admin_client.get(CHANGELIST, {"q": "42"})) == [inside]


def test_search_by_id_prefix_and_by_its_upper_case(admin_client):
    ids = [make(event=f"e{i}") for i in range(5)]
    one = ids[0]
    assert listed(admin_client.get(CHANGELIST, {"q": one[:6]})) == [
        i for i in listed(admin_client.get(CHANGELIST)) if i.startswith(one[:6])
    ]
    assert listed(admin_client.get(CHANGELIST, {"q": f"  {one}  "})) == [one]
    assert listed(admin_client.get(CHANGELIST, {"q": one[:12].upper()})) == [one]


def test_search_with_filters_searches_only_what_they_leave(admin_client):
    make(event="same")
    done = make("completed", event="same", target="https://other.example/")
    response = admin_client.get(CHANGELIST, {"q": "same", "state__exact": "completed"})
    assert listed(response) == [done]


# -- actions ------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["retry_now", "cancel"])
def test_an_action_runs_as_many_statements_for_100_intents_as_for_10(admin_client, action):
    ids = [make(event=f"e{i}", next_in=600) for i in range(111)]

    def statements(selected: list[str]) -> int:
        server_now()  # a fresh reading of the clock: none is taken while counting
        with CaptureQueriesContext(connection) as captured:
            response = act(admin_client, action, selected)
        assert response.status_code == 302
        return len(captured)

    statements(ids[:1])  # the first pays for what Django caches (the content type)
    few, many = statements(ids[1:11]), statements(ids[11:])
    assert few == many
    expected = "pending" if action == "retry_now" else "cancelled"
    assert set(Intent.objects.values_list("state", flat=True)) == {expected}
    assert LogEntry.objects.count() == 111


def test_an_action_reports_what_it_moved_and_logs_only_that(admin_client):
    waiting = make(event="w", next_in=600)
    running = make("running", event="r")
    done = make("completed", event="d")
    response = act(admin_client, "cancel", [waiting, running, done])
    assert notes(response) == [
        (25, "Cancelled 2 intents."),
        (30, "Skipped 1 intent: 1 already completed."),
    ]
    assert dict(Intent.objects.values_list("pk", "state")) == {
        waiting: "cancelled",
        running: "cancelled",
        done: "completed",
    }
    assert Intent.objects.get(pk=running).claim_token == ""
    logged = LogEntry.objects.order_by("object_id").values_list("object_id", "object_repr")
    assert sorted(logged) == sorted(
        (pk, f"webhook {pk[:12]} (cancelled)") for pk in (waiting, running)
    )


def test_a_refused_action_on_finished_intents_writes_nothing(admin_client):
    ids = [make("completed", event=f"d{i}") for i in range(3)]
    before = snapshot()
    response = act(admin_client, "retry_now", ids)
    assert notes(response) == [(30, "Skipped 3 intents: 3 already completed.")]
    assert snapshot() == before
    assert not LogEntry.objects.exists()
