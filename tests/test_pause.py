"""Paused kinds (SPEC §11): ``pause``, ``resume``, ``paused``, and every claim skipping them.

Time is driven by ``now=``; real worker processes are in ``test_pause_process.py``.
Every refused call checks that nothing was written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.contrib.messages.constants import ERROR, SUCCESS, WARNING
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_intents.models import Intent, PausedKind
from django_intents.observability import metrics
from django_intents.store import ClaimFilters, backend_for

from .conftest import T0, at, branch_plan, enqueue, external_kinds, intents, row, snapshot
from .test_admin import CHANGELIST, staff
from .test_health import health
from .test_metrics import scrape, series

pytestmark = pytest.mark.django_db


def paused_rows() -> list[tuple[str, object]]:
    return list(PausedKind.objects.order_by("kind").values_list("kind", "paused_at"))


def test_pause_records_the_kind_once_and_says_whether_it_changed_anything():
    assert Intent.objects.pause("webhook", now=T0) is True
    assert Intent.objects.pause("webhook", now=at(5)) is False
    assert paused_rows() == [("webhook", T0)]
    assert Intent.objects.paused() == {"webhook"}


def test_resume_forgets_the_kind_and_says_whether_it_was_paused():
    Intent.objects.pause("webhook", now=T0)
    Intent.objects.pause("job", now=T0)
    assert Intent.objects.resume("webhook") is True
    assert Intent.objects.resume("webhook") is False
    assert Intent.objects.paused() == {"job"}


def test_nothing_is_paused_at_first():
    assert Intent.objects.paused() == set()
    assert Intent.objects.resume("webhook") is False


@pytest.mark.parametrize(
    ("kind", "error"),
    [("", "kind must not be empty"), ("  ", "kind must not be blank"), (None, "kind must be"),
     ("x" * 101, "kind is 101 characters"), ("a\x00b", "kind must not contain NUL")],
)  # fmt: skip
def test_pause_and_resume_refuse_a_bad_kind_and_write_nothing(kind, error):
    Intent.objects.pause("webhook", now=T0)
    with pytest.raises(ValueError, match=error):
        Intent.objects.pause(kind, now=T0)
    with pytest.raises(ValueError, match=error):
        Intent.objects.resume(kind)
    assert paused_rows() == [("webhook", T0)]


def test_kinds_are_compared_exactly():
    """On MySQL the test database's utf8mb4_bin pads: migration 0006 makes the key NO PAD."""
    Intent.objects.pause("webhook ", now=T0)
    [id] = enqueue(kind="webhook")
    assert Intent.objects.claim(now=at(1)).id == id
    assert Intent.objects.paused() == {"webhook "}


class TestClaimsSkipPausedKinds:
    def test_claim_skips_a_paused_kind_and_takes_the_others(self):
        [paused] = enqueue(kind="webhook")
        [other] = enqueue(kind="job", now=at(1))
        Intent.objects.pause("webhook", now=at(2))
        claimed = Intent.objects.claim(now=at(3))
        assert claimed.id == other
        assert Intent.objects.claim(now=at(3)) is None
        assert (row(paused).state, row(paused).attempts) == ("pending", 0)

    def test_claim_many_with_kinds_takes_nothing_of_a_paused_kind(self):
        ids = enqueue(3, kind="webhook")
        Intent.objects.pause("webhook", now=T0)
        before = snapshot()
        assert Intent.objects.claim_many(5, now=at(1), kinds=["webhook"]) == []
        assert Intent.objects.claim_many(5, now=at(1), since=T0) == []
        assert snapshot() == before
        assert Intent.objects.resume("webhook") is True
        claimed = Intent.objects.claim_many(5, now=at(2), kinds=["webhook"])
        assert sorted(intent.id for intent in claimed) == sorted(ids)

    def test_an_expired_lease_of_a_paused_kind_is_not_taken_over(self):
        [id] = enqueue(kind="webhook")
        token = Intent.objects.claim(now=T0, lease=5).claim_token
        Intent.objects.pause("webhook", now=at(1))
        assert Intent.objects.claim(now=at(10)) is None
        assert (row(id).state, row(id).claim_token) == ("running", token)

    def test_a_running_attempt_of_a_paused_kind_finishes_normally(self):
        [id] = enqueue(kind="webhook")
        token = Intent.objects.claim(now=T0).claim_token
        Intent.objects.pause("webhook", now=at(1))
        assert Intent.objects.complete(id, token, now=at(2)) is True
        assert row(id).state == "completed"

    def test_enqueue_still_records_a_paused_kind(self):
        Intent.objects.pause("webhook", now=T0)
        [id] = enqueue(kind="webhook")
        assert row(id).state == "pending"
        assert Intent.objects.claim(now=at(1)) is None

    def test_has_due_leaves_paused_kinds_out(self):
        enqueue(kind="webhook")
        Intent.objects.pause("webhook", now=T0)
        assert Intent.objects.has_due(now=at(1)) is False
        assert Intent.objects.has_due(now=at(1), kinds=["webhook"]) is False
        enqueue(kind="job")
        assert Intent.objects.has_due(now=at(1)) is True
        Intent.objects.resume("webhook")
        assert Intent.objects.has_due(now=at(1), kinds=["webhook"]) is True


@pytest.mark.django_db(transaction=True)
def test_a_limited_claim_skips_a_paused_kind(settings):
    settings.INTENTS = intents(LIMITS={"webhook": {"running": 2}})
    ids = enqueue(2, kind="webhook")
    Intent.objects.pause("webhook", now=T0)
    assert Intent.objects.claim_many(2, now=at(1), kinds=["webhook"]) == []
    assert {row(id).state for id in ids} == {"pending"}
    Intent.objects.resume("webhook")
    assert len(Intent.objects.claim_many(2, now=at(2), kinds=["webhook"])) == 2


class TestQueryPlan:
    """The pause test is inside the claim's statement and keeps it on the claim index."""

    @pytest.mark.parametrize("kinds", [None, ["webhook", "job"]])
    def test_claim_with_a_paused_kind_uses_the_claimable_index(self, vendor, kinds):
        items = [{"kind": "webhook", "event_id": str(i), "target": "t"} for i in range(300)]
        Intent.objects.enqueue_many(items, now=T0)
        Intent.objects.pause("job", now=T0)
        backend = backend_for(connection, Intent)
        filters = ClaimFilters(kinds=kinds, since=T0)
        queries = backend.claim_queries(now=at(1), limit=10, filters=filters)
        index = "intents_claim_mysql_idx" if vendor == "mysql" else "intents_claimable_idx"
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute("ANALYZE django_intents_intent")
                cursor.execute("ANALYZE django_intents_pausedkind")
            statement, params = queries[0]
            assert "pausedkind" in statement
            explain = "EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN "
            cursor.execute(explain + statement.replace(" FOR UPDATE SKIP LOCKED", ""), params)
            plan = " ".join(str(part) for line in cursor.fetchall() for part in line)
        assert index in plan, plan
        assert "TEMP B-TREE" not in plan.upper(), plan
        # Only MariaDB's branch of expired leases sorts, and it holds only those.
        assert plan.count("filesort") <= 1, plan
        if vendor == "postgresql":
            assert "InitPlan" in plan, plan
            assert "Sort" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_the_pause_test_looks_unselective_to_the_planner_after_a_vacuum(vendor):
    """As ``test_claim``'s kind filter test: VACUUM has run, ANALYZE never has.

    Were the pause test estimated to keep few rows, PostgreSQL would fetch and
    sort every due row instead of walking the claim index and stopping at LIMIT.
    """
    if vendor != "postgresql":
        pytest.skip("VACUUM and the planner's estimates are PostgreSQL's")
    items = [{"kind": "webhook", "event_id": str(i), "target": "t"} for i in range(2000)]
    Intent.objects.enqueue_many(items, now=T0)
    Intent.objects.pause("job", now=T0)
    backend = backend_for(connection, Intent)
    table = Intent._meta.db_table
    [(claim, params)] = backend.claim_queries(now=at(1), limit=8, filters=ClaimFilters(since=T0))
    with backend.cursor() as cursor:
        cursor.execute(f"VACUUM {table}")
        not_paused = backend.sql.fragment("not_paused")
        cursor.execute(f"EXPLAIN SELECT id FROM {table} WHERE {not_paused}")
        estimate = int(re.search(r"rows=(\d+)", cursor.fetchall()[0][0]).group(1))
        cursor.execute("EXPLAIN " + claim, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert estimate > 1800, f"the pause test is estimated to keep {estimate} of 2000 rows"
    zero = branch_plan(plan, "zero")  # the other priorities' branches hold no rows here
    assert "Index Scan using intents_claimable_idx" in zero, plan
    assert "Sort" not in zero, plan


class ElsewhereRouter:
    """Sends the queue to an alias that does not exist: only ``--database`` reaches it."""

    def db_for_write(self, model, **hints):
        return "elsewhere"

    db_for_read = db_for_write


def run(command: str, *args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(command, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


class TestCommands:
    def test_intents_pause_says_per_kind_what_it_did(self):
        Intent.objects.pause("job", now=T0)
        out, err = run("intents_pause", "webhook", "job")
        assert out.splitlines() == ["webhook: paused", "job: already paused"]
        assert err == ""
        assert Intent.objects.paused() == {"webhook", "job"}

    def test_intents_resume_says_per_kind_what_it_did(self):
        Intent.objects.pause("job", now=T0)
        out, _ = run("intents_resume", "job", "webhook")
        assert out.splitlines() == ["job: resumed", "webhook: not paused"]
        assert Intent.objects.paused() == set()

    @pytest.mark.parametrize("command", ["intents_pause", "intents_resume"])
    def test_a_bad_kind_fails_the_command_and_nothing_is_written(self, command):
        Intent.objects.pause("job", now=T0)
        with pytest.raises(CommandError, match="bad kind '  '.*nothing was changed") as caught:
            run(command, "webhook", "  ", "job")
        assert caught.value.returncode == 1
        assert paused_rows() == [("job", T0)]

    def test_a_kind_no_handler_runs_is_paused_with_a_warning(self):
        out, err = run("intents_pause", "webhok")
        assert out == "webhok: paused\n"
        assert "no handler in this project runs 'webhok'" in err
        assert Intent.objects.paused() == {"webhok"}

    @pytest.mark.parametrize("command", ["intents_pause", "intents_resume"])
    def test_database_names_the_alias_instead_of_the_routers_choice(self, command, settings):
        Intent.objects.pause("webhook", now=T0)
        settings.DATABASE_ROUTERS = [f"{__name__}.ElsewhereRouter"]
        out, _ = run(command, "webhook", "--database", "default")
        assert out.startswith("webhook: ")
        with pytest.raises(CommandError, match="unknown database alias 'nowhere'"):
            run(command, "webhook", "--database", "nowhere")
        settings.DATABASE_ROUTERS = []
        expected = {"webhook"} if command == "intents_pause" else set()
        assert Intent.objects.paused() == expected


# -- the gauge and intents_health ----------------------------------------------------------


@pytest.fixture
def fresh_gauges() -> Iterator[None]:
    metrics.QUEUE.invalidate()
    yield
    metrics.QUEUE.invalidate()


def test_paused_gauge_is_1_for_a_paused_kind_and_0_for_the_others(client, settings, fresh_gauges):
    settings.INTENTS = intents(METRIC_KINDS=["webhook", "job"])
    Intent.objects.pause("webhook", now=T0)
    Intent.objects.pause("made-up", now=T0)
    enqueue(2, kind="webhook")
    samples = scrape(client)
    assert samples[series("django_intents_paused", kind="webhook")] == 1
    assert samples[series("django_intents_paused", kind="job")] == 0
    assert samples[series("django_intents_paused", kind="other")] == 1  # made-up
    assert samples[series("django_intents_pending", kind="webhook")] == 2
    Intent.objects.resume("webhook")
    samples = scrape(client)  # cached for GAUGE_CACHE, like the other gauges
    assert samples[series("django_intents_paused", kind="webhook")] == 1
    metrics.QUEUE.invalidate()
    assert scrape(client)[series("django_intents_paused", kind="webhook")] == 0


@pytest.mark.django_db(transaction=True)
def test_health_does_not_fail_for_a_paused_kind_and_names_it(capsys):
    long_ago = timezone.now() - timedelta(seconds=400)
    Intent.objects.enqueue("webhook", "held", "t", next_at=long_ago, now=long_ago)
    Intent.objects.pause("webhook")
    code, out, _ = health(capsys=capsys)
    assert code == 0, out
    assert out.splitlines() == [
        "paused: 'webhook' (1 due); not counted as stuck",
        "ok: nothing is due (1 pending, max age 300s)",
    ]
    Intent.objects.resume("webhook")
    code, _, err = health(capsys=capsys)
    assert code == 1
    assert "stuck: oldest due intent (kind 'webhook')" in err


@pytest.mark.django_db(transaction=True)
def test_health_still_fails_for_another_kind_stuck_beside_a_paused_one(capsys):
    long_ago = timezone.now() - timedelta(seconds=400)
    for kind in ("webhook", "job"):
        Intent.objects.enqueue(kind, "held", "t", next_at=long_ago, now=long_ago)
    Intent.objects.pause("webhook")
    code, out, err = health(capsys=capsys)
    assert code == 1
    assert "paused: 'webhook' (1 due)" in out
    assert "stuck: oldest due intent (kind 'job')" in err


# -- the admin ------------------------------------------------------------------------------

PAUSE_URL = reverse("admin:django_intents_intent_pause")
RESUME_URL = reverse("admin:django_intents_intent_resume")


def kind_row(html: str, kind: str) -> str:
    found = re.search(rf'<tr data-kind="{re.escape(kind)}">(.*?)</tr>', html, re.S)
    assert found, html
    return found.group(1)


def flashed(response) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


class TestAdmin:
    @pytest.fixture
    def viewer(self, client, django_user_model):
        client.force_login(staff(django_user_model, "view_intent"))
        return client

    def test_summary_shows_paused_kinds_with_a_resume_button_and_others_a_pause_button(
        self, admin_client
    ):
        enqueue(kind="webhook")
        enqueue(kind="job")
        Intent.objects.pause("job", now=T0)
        Intent.objects.pause("push", now=T0)  # nothing waiting: listed all the same
        html = admin_client.get(CHANGELIST).content.decode()
        job, webhook, push = (kind_row(html, kind) for kind in ("job", "webhook", "push"))
        assert 'data-paused="1"' in job and 'data-paused="1"' in push
        assert f'action="{RESUME_URL}"' in job and 'name="csrfmiddlewaretoken"' in job
        assert 'data-paused="0"' in webhook and f'action="{PAUSE_URL}"' in webhook

    def test_pause_button_pauses_the_kind_logs_and_says_so(self, admin_client, admin_user):
        response = admin_client.post(PAUSE_URL, {"kind": "webhook"})
        assert response.status_code == 302 and response.url == CHANGELIST
        assert Intent.objects.paused() == {"webhook"}
        assert flashed(response) == [
            (SUCCESS, "Paused kind “webhook”: pools stop claiming it at their next claim.")
        ]
        [entry] = LogEntry.objects.filter(user=admin_user, action_flag=CHANGE)
        assert (entry.object_id, entry.change_message) == ("webhook", "Paused.")
        assert entry.content_type.model_class() is PausedKind

    def test_resume_button_resumes_the_kind(self, admin_client):
        Intent.objects.pause("webhook", now=T0)
        response = admin_client.post(RESUME_URL, {"kind": "webhook"})
        assert Intent.objects.paused() == set()
        assert flashed(response)[0][0] == SUCCESS
        assert LogEntry.objects.get().change_message == "Resumed."

    def test_a_button_that_changes_nothing_warns_and_logs_nothing(self, admin_client):
        Intent.objects.pause("webhook", now=T0)
        response = admin_client.post(PAUSE_URL, {"kind": "webhook"})
        assert flashed(response) == [(WARNING, "Kind “webhook” was already paused.")]
        assert paused_rows() == [("webhook", T0)]
        assert not LogEntry.objects.exists()

    @pytest.mark.parametrize("data", [{}, {"kind": " "}, {"kind": "x" * 101}])
    def test_a_bad_kind_is_an_error_message_and_nothing_is_written(self, admin_client, data):
        response = admin_client.post(PAUSE_URL, data)
        assert response.status_code == 302
        [(level, message)] = flashed(response)
        assert level == ERROR and message.startswith("kind ")
        assert paused_rows() == []
        assert not LogEntry.objects.exists()

    def test_the_buttons_take_only_a_post(self, admin_client):
        assert admin_client.get(PAUSE_URL + "?kind=webhook").status_code == 405
        assert paused_rows() == []

    def test_the_buttons_require_the_csrf_token(self, admin_user):
        client = Client(enforce_csrf_checks=True)
        client.force_login(admin_user)
        assert client.post(PAUSE_URL, {"kind": "webhook"}).status_code == 403
        assert paused_rows() == []

    @pytest.mark.parametrize("url", [PAUSE_URL, RESUME_URL])
    def test_view_only_staff_see_no_buttons_and_cannot_forge_one(self, viewer, url):
        Intent.objects.pause("job", now=T0)
        html = viewer.get(CHANGELIST).content.decode()
        assert 'data-paused="1"' in kind_row(html, "job")
        assert "intents-kind-form" not in html
        assert viewer.post(url, {"kind": "job"}).status_code == 403
        assert viewer.post(url, {"kind": "webhook"}).status_code == 403
        assert paused_rows() == [("job", T0)]


@pytest.mark.django_db(transaction=True)
def test_health_still_fails_for_a_paused_kind_that_no_handler_runs(capsys):
    with external_kinds("made.up"):
        Intent.objects.enqueue("made.up", "e", "t")
    Intent.objects.pause("made.up")
    code, out, err = health(capsys=capsys)
    assert code == 1
    assert "paused: 'made.up' (1 due)" in out
    assert "unhandled: intents are due of kind(s) that no handler in this project runs" in err


def test_a_pause_costs_a_claim_no_query_of_its_own():
    enqueue(3, kind="webhook")

    def claim_queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            Intent.objects.claim(now=at(1), kinds=["webhook"])
            Intent.objects.has_due(now=at(1))
        return len(captured)

    unpaused = claim_queries()
    Intent.objects.pause("job", now=T0)
    assert claim_queries() == unpaused
