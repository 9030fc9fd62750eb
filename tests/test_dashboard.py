"""The admin's dashboard and the per-minute rollup it is drawn from.

The rollup: real ``attempt_finished`` signals are counted per kind and minute,
flushes add to a minute rather than overwrite it (twice from one pool, once
each from two), the queue depth is sampled, old rows go, and a failed write
keeps its counts for the next flush. A drain writes its outcomes at exit.

The page: it renders with data and without (saying who writes the data), only
for users who may view intents, escapes what kinds carry, and costs the same
number of queries with 200 intents as with 2,000.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import DatabaseError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_intents.admin.dashboard import read_charts
from django_intents.models import Intent, Rollup
from django_intents.observability import rollup
from django_intents.observability.rollup import Tally, minute_of
from django_intents.signals import Outcome, attempt_finished
from django_intents.store.clock import server_now
from django_intents.worker.pool import WorkerPool

from .conftest import external_kinds

DASHBOARD = "admin:django_intents_intent_dashboard"
KINDS = ("d.mail", "d.hook", "d.slow")


@pytest.fixture(autouse=True)
def dashboard_kinds() -> Iterator[None]:
    with external_kinds(*KINDS, "<b>d.odd</b>"):
        yield


@pytest.fixture
def tally() -> Iterator[Tally]:
    """The process's tally, emptied before and after the test."""
    rollup.TALLY.take()
    yield rollup.TALLY
    rollup.TALLY.take()


def rows() -> dict[str, Rollup]:
    return {row.kind: row for row in Rollup.objects.all()}


def finish(kind: str, outcome: str, duration: float = 0.1) -> None:
    attempt_finished.send(sender=Intent, kind=kind, outcome=outcome, duration=duration, intent=None)


# -- the rollup ----------------------------------------------------------------


@pytest.mark.django_db
def test_signals_are_counted_per_kind_and_outcome(tally: Tally) -> None:
    for outcome in (Outcome.SUCCESS, Outcome.SUCCESS, Outcome.ERROR, Outcome.SNOOZED):
        finish("d.mail", outcome, 0.5)
    finish("d.mail", Outcome.STOPPED, 2.0)
    finish("d.mail", Outcome.FENCED, 0.25)
    # An outcome without a column of its own (issue 40's timeout) is a failure.
    tally.record("d.hook", "timeout", 30.0)
    tally.flush(sample=False)
    mail, hook = rows()["d.mail"], rows()["d.hook"]
    assert (mail.completed, mail.failed, mail.snoozed, mail.cancelled) == (2, 1, 1, 1)
    assert mail.attempts == 6  # the fenced attempt counts only here
    assert mail.duration_sum == pytest.approx(4.25)
    assert mail.duration_max == pytest.approx(2.0)
    assert (hook.failed, hook.attempts, hook.duration_max) == (1, 1, 30.0)
    assert mail.minute == minute_of(server_now())
    assert mail.due is None  # not sampled
    assert tally.take() == []  # flushed: nothing left to write


@pytest.mark.django_db
def test_two_flushes_of_one_minute_add_up() -> None:
    tally, at = Tally(), server_now()
    tally.record("d.mail", Outcome.SUCCESS, 1.0, at)
    tally.record("d.mail", Outcome.ERROR, 3.0, at)
    tally.flush(sample=False)
    tally.record("d.mail", Outcome.SUCCESS, 2.0, at)
    tally.flush(sample=False)
    (row,) = Rollup.objects.all()
    assert (row.completed, row.failed, row.attempts) == (2, 1, 3)
    assert row.duration_sum == pytest.approx(6.0)
    assert row.duration_max == pytest.approx(3.0)


@pytest.mark.django_db
def test_two_pools_flushing_one_minute_add_up() -> None:
    first, second, at = Tally(), Tally(), server_now()
    for _ in range(3):
        first.record("d.mail", Outcome.SUCCESS, 1.0, at)
    second.record("d.mail", Outcome.SUCCESS, 5.0, at)
    second.record("d.hook", Outcome.SNOOZED, 0.5, at)
    first.flush()
    second.flush()
    first.record("d.mail", Outcome.ERROR, 0.5, at)
    first.flush()
    found = rows()
    assert (found["d.mail"].completed, found["d.mail"].failed) == (3 + 1, 1)
    assert found["d.mail"].duration_max == pytest.approx(5.0)
    assert found["d.hook"].snoozed == 1


@pytest.mark.django_db
def test_minutes_are_kept_apart() -> None:
    tally, now = Tally(), server_now()
    tally.record("d.mail", Outcome.SUCCESS, 1.0, now - timedelta(minutes=1))
    tally.record("d.mail", Outcome.SUCCESS, 1.0, now)
    tally.flush(sample=False)
    minutes = sorted(Rollup.objects.values_list("minute", flat=True))
    assert minutes == [minute_of(now - timedelta(minutes=1)), minute_of(now)]


@pytest.mark.django_db
def test_depth_is_sampled_once_a_minute() -> None:
    for i in range(3):
        Intent.objects.enqueue("d.mail", f"due-{i}", "t", None)
    Intent.objects.enqueue("d.hook", "later", "t", None, next_at=server_now() + timedelta(hours=1))
    tally = Tally()
    tally.flush()
    mail = rows()["d.mail"]
    assert (mail.due, mail.running, mail.completed) == (3, 0, 0)
    assert rows()["d.hook"].due == 0  # waiting, but not due
    Intent.objects.enqueue("d.mail", "due-3", "t", None)
    tally.record("d.mail", Outcome.SUCCESS, 1.0)
    tally.flush()  # the same minute: counted, not sampled again
    mail = rows()["d.mail"]
    if mail.minute == minute_of(server_now()):
        assert (mail.due, mail.completed) == (3, 1)


@pytest.mark.django_db
def test_rows_older_than_two_days_are_deleted() -> None:
    now = server_now()
    Rollup.objects.create(minute=minute_of(now - timedelta(days=3)), kind="d.mail", completed=1)
    kept = Rollup.objects.create(minute=minute_of(now - timedelta(days=1)), kind="d.mail")
    Tally().flush(sample=False)
    assert list(Rollup.objects.values_list("pk", flat=True)) == [kept.pk]


def test_an_unflushed_tally_forgets_minutes_older_than_two_days() -> None:
    tally, now = Tally(), timezone.now()
    tally.record("d.mail", Outcome.SUCCESS, 1.0, now - timedelta(days=3))
    tally.record("d.mail", Outcome.SUCCESS, 1.0, now)
    assert [row.minute for row in tally.take()] == [minute_of(now)]


@pytest.mark.django_db
def test_a_failed_write_keeps_its_counts_for_the_next_flush(monkeypatch: Any) -> None:
    tally, at = Tally(), server_now()
    tally.record("d.mail", Outcome.SUCCESS, 1.0, at)

    def broken(*args: Any) -> None:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(rollup, "upsert", broken)
    with pytest.raises(DatabaseError):
        tally.flush(sample=False)
    tally.record("d.mail", Outcome.SUCCESS, 1.0, at)
    monkeypatch.undo()
    tally.flush(sample=False)
    assert rows()["d.mail"].completed == 2


@pytest.mark.django_db
def test_flush_logs_a_failure_once_instead_of_raising(
    monkeypatch: Any, caplog: Any, tally: Tally
) -> None:
    caplog.set_level("INFO", logger="django_intents.observability")

    def broken(*args: Any) -> None:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(rollup, "upsert", broken)
    rollup.flush(sample=False)
    rollup.flush(sample=False)
    assert caplog.text.count("writing the dashboard's rollup failed") == 1
    monkeypatch.undo()
    rollup.flush(sample=False)
    assert "writing the dashboard's rollup works again" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_drained_pool_writes_its_outcomes(tally: Tally) -> None:
    for i in range(4):
        Intent.objects.enqueue("d.mail", f"e{i}", "t", None)
    pool = WorkerPool(
        handlers={"d.mail": lambda target, payload: None},
        workers=2,
        poll_interval=0.05,
        drain=True,
        handle_signals=False,
    )
    assert pool.run() == 0
    assert sum(Rollup.objects.values_list("completed", flat=True)) == 4


# -- the page --------------------------------------------------------------------


def staff(django_user_model: Any, name: str, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


@pytest.mark.django_db
def test_the_page_says_who_writes_the_data_when_there_is_none(admin_client: Client) -> None:
    response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-dashboard="empty"' in html
    assert "the rollup is written by run_intent_workers" in html
    assert "No intent is running." in html


@pytest.mark.django_db
def test_the_page_draws_each_kind_from_the_rollup(admin_client: Client) -> None:
    tally, now = Tally(), server_now()
    for _ in range(5):
        tally.record("d.mail", Outcome.SUCCESS, 0.2, now)
    tally.record("d.mail", Outcome.ERROR, 0.4, now)
    tally.record("d.slow", Outcome.SUCCESS, 9.0, now - timedelta(hours=3))
    tally.record("<b>d.odd</b>", Outcome.SNOOZED, 1.0, now)
    Intent.objects.enqueue("d.hook", "waiting", "https://partner.example/<x>", None)
    tally.flush()
    Intent.objects.pause("d.hook")
    html = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert 'data-dashboard="empty"' not in html
    assert '<tr data-kind="d.mail">' in html
    mail = html.split('<tr data-kind="d.mail">')[1].split("</tr>")[0]
    assert '<span class="intents-completed-text" data-total="completed">5</span>' in mail
    assert 'data-total="failed">1</span>' in mail
    assert mail.count("<svg") == 4
    assert "5 completed, 1 failed, 0 snoozed, 0 cancelled</title>" in mail  # a tooltip
    slow = html.split('<tr data-kind="d.slow">')[1].split("</tr>")[0]
    assert 'data-total="completed">0</span>' in slow  # three hours ago: the day chart only
    assert html.index('data-slow="d.slow"') < html.index('data-slow="d.mail"')
    hook = html.split('<tr data-kind="d.hook">')[1].split("</tr>")[0]
    assert "paused" in hook and 'data-total="due">1</span>' in hook
    assert 'data-paused-kind="d.hook"' in html
    assert "data-due=" in html and "https://partner.example/&lt;x&gt;" in html
    assert "<b>d.odd</b>" not in html and "&lt;b&gt;d.odd&lt;/b&gt;" in html


@pytest.mark.django_db
def test_the_page_lists_the_longest_running_intents(admin_client: Client) -> None:
    now = server_now()
    intent_id = Intent.objects.enqueue("d.mail", "long", "t", None)
    Intent.objects.filter(pk=intent_id).update(
        state="running",
        attempts=1,
        claim_token="a" * 32,
        claim_until=now + timedelta(minutes=5),
        updated_at=now - timedelta(minutes=20),
    )
    html = admin_client.get(reverse(DASHBOARD)).content.decode()
    running = html.split(f'<tr data-running="{intent_id}">')[1].split("</tr>")[0]
    assert "20 min" in running


@pytest.mark.django_db
def test_the_page_needs_the_view_permission(client: Client, django_user_model: Any) -> None:
    url = reverse(DASHBOARD)
    assert client.get(url).status_code == 302  # anonymous: to the login page
    client.force_login(staff(django_user_model, "staff"))  # staff, but no permission
    assert client.get(url).status_code == 403
    client.force_login(staff(django_user_model, "viewer", "view_intent"))
    assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_the_changelist_links_to_the_page(admin_client: Client) -> None:
    html = admin_client.get(reverse("admin:django_intents_intent_changelist")).content.decode()
    assert f'href="{reverse(DASHBOARD)}"' in html


@pytest.mark.django_db
def test_the_page_costs_the_same_queries_whatever_the_table_holds(
    admin_client: Client, django_assert_max_num_queries: Any
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(DASHBOARD)).status_code == 200
        return len(captured)

    def add(n: int, start: int) -> None:
        Intent.objects.enqueue_many(
            {"kind": KINDS[i % 3], "event_id": f"e{i}", "target": "t", "payload": None}
            for i in range(start, start + n)
        )

    tally = Tally()
    for kind in KINDS:
        tally.record(kind, Outcome.SUCCESS, 1.0)
    tally.flush()
    admin_client.get(reverse(DASHBOARD))  # the session and the clock are read once
    add(200, 0)
    few = queries()
    add(1800, 200)
    assert queries() == few
    with django_assert_max_num_queries(few):
        admin_client.get(reverse(DASHBOARD))


@pytest.mark.django_db
def test_the_day_chart_sums_its_quarters_and_the_hour_chart_its_minutes() -> None:
    now = server_now()
    end = minute_of(now)
    for back in range(0, 24 * 60, 7):  # a row every 7 minutes over the day
        Rollup.objects.create(
            minute=end - timedelta(minutes=back),
            kind="d.mail",
            completed=back % 5,
            failed=1,
            attempts=back % 5 + 1,
            duration_sum=0.5,
            duration_max=back / 100,
            due=back,
        )
    Rollup.objects.create(minute=end - timedelta(days=1, hours=1), kind="d.mail", completed=99)
    (chart,) = read_charts(now, connection.alias, set())
    day = list(
        Rollup.objects.filter(minute__gt=chart.day[0].start - timedelta(minutes=1)).values_list(
            "completed", "failed", "due", "duration_max"
        )
    )
    assert sum(bucket.completed for bucket in chart.day) == sum(row[0] for row in day)
    assert sum(bucket.failed for bucket in chart.day) == len(day)
    assert max(bucket.due or 0 for bucket in chart.day) == max(row[2] for row in day)
    assert chart.day[-1].start <= end < chart.day[-1].start + timedelta(minutes=15)
    assert chart.day[-1].start.minute % 15 == 0
    hour = [(end - timedelta(minutes=back), back % 5) for back in range(0, 60, 7)]
    for minute, completed in hour:
        assert chart.hour[int((minute - chart.hour[0].start) / timedelta(minutes=1))].completed == (
            completed
        )
    assert chart.hour_timing.attempts == sum(completed + 1 for _, completed in hour)
    assert chart.day_timing.longest == pytest.approx(max(row[3] for row in day))
