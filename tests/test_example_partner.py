"""The example shop's flow control: ``Retry-After`` snoozes, and the partner page that causes them.

The webhook handler reads ``Retry-After`` on 429 and 503 and snoozes the intent;
the partner page switches the shop's receiver to answer 429 with the header,
or to hang past the handler's timeout. Each failure path is checked in the
rows it leaves: the intent's state, attempts, snoozes and last error, and what
the partner stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

import pytest
from django.core.signals import request_finished
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import http_date

from django_intents import Attempt, Retry
from django_intents.models import Intent
from django_intents.store.clock import server_now
from django_intents.worker.pool import WorkerPool

from .conftest import intents
from .shoputil import shop_app  # noqa: F401 - an autouse fixture: installs the shop

with override_settings(INSTALLED_APPS=["django_intents", "example_project.shop"]):
    from example_project.shop import handlers as shop_handlers
    from example_project.shop import views as shop_views
    from example_project.shop.handlers import DeliveryFailed, deliver_webhook, retry_after
    from example_project.shop.models import Partner, ReceivedWebhook
    from example_project.shop.ratelimit import SlidingWindow

RECEIVER = "/webhooks/receive/"
NOW = datetime(2026, 10, 21, 7, 0, tzinfo=UTC)
HOUR = 3600


# -- Retry-After, parsed ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"), [("120", 120), (" 30 ", 30), ("0", 0), ("007", 7), ("3600", HOUR)]
)
def test_retry_after_in_seconds_is_read_as_whole_seconds(value: str, seconds: int):
    assert retry_after(value, NOW) == seconds


@pytest.mark.parametrize("value", ["3601", "86400", "9" * 5000, "0" * 40 + "99999"])
def test_retry_after_in_seconds_over_an_hour_is_capped_at_an_hour(value: str):
    assert retry_after(value, NOW) == HOUR


def test_retry_after_as_an_http_date_is_an_aware_datetime():
    assert retry_after("Wed, 21 Oct 2026 07:28:00 GMT", NOW) == NOW + timedelta(minutes=28)


def test_retry_after_as_an_http_date_without_a_zone_is_read_as_gmt():
    assert retry_after("Wed, 21 Oct 2026 07:28:00 -0000", NOW) == NOW + timedelta(minutes=28)


def test_retry_after_as_an_http_date_over_an_hour_away_is_capped_at_an_hour():
    assert retry_after("Fri, 21 Oct 2027 07:00:00 GMT", NOW) == NOW + timedelta(hours=1)


def test_retry_after_as_an_http_date_in_the_past_snoozes_until_now():
    past = retry_after("Tue, 20 Oct 2026 07:00:00 GMT", NOW)

    assert past == NOW - timedelta(days=1)
    assert Retry(after=past).due(NOW) == NOW


@pytest.mark.parametrize(
    "value",
    ["", "  ", "soon", "-5", "+5", "1.5", "5 seconds", "\u00b2", "Wed, 99 Oct 2026 07:28:00 GMT"],
)
def test_a_retry_after_that_is_neither_seconds_nor_a_date_is_a_value_error(value: str):
    with pytest.raises(ValueError, match="neither seconds nor an HTTP date"):
        retry_after(value, NOW)


# -- the handler, against a partner that answers as told ----------------------------------


class ScriptedPartner(http.server.BaseHTTPRequestHandler):
    """Answers every POST with ``status`` and, if set, that ``Retry-After``."""

    status = 200
    retry_after: str | None = None
    requests: ClassVar[list[str]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(self.headers.get("Idempotency-Key") or "")
        self.send_response(self.status)
        if self.retry_after is not None:
            self.send_header("Retry-After", self.retry_after)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass


@pytest.fixture
def scripted() -> Iterator[str]:
    ScriptedPartner.status, ScriptedPartner.retry_after = 200, None
    ScriptedPartner.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedPartner)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def claimed(target: str, event_id: str = "order-1-placed") -> Intent:
    Intent.objects.enqueue("webhook", event_id, target, {"event": "order.placed"})
    intent = Intent.objects.claim(kinds=["webhook"])
    assert intent is not None
    return intent


def run_webhook(intent: Intent) -> None:
    asyncio.run(deliver_webhook(intent, Attempt(intent)))


def assert_untouched_while_running(intent: Intent) -> None:
    """Without a pool nothing records the outcome: the claim is all the row shows."""
    row = Intent.objects.get(pk=intent.pk)
    assert (row.state, row.attempts, row.snoozes, row.last_error) == ("running", 1, 0, "")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_503_with_retry_after_in_seconds_raises_a_snooze(scripted: str, status: int):
    ScriptedPartner.status, ScriptedPartner.retry_after = status, "7"
    intent = claimed(scripted)

    with pytest.raises(Retry) as raised:
        run_webhook(intent)

    assert raised.value.after == timedelta(seconds=7)
    assert raised.value.reason == f"partner answered {status} with Retry-After: 7"
    assert ScriptedPartner.requests == [intent.id]
    assert_untouched_while_running(intent)


@pytest.mark.django_db(transaction=True)
def test_a_429_with_retry_after_as_an_http_date_snoozes_until_that_time(scripted: str):
    then = timezone.now().replace(microsecond=0) + timedelta(minutes=2)
    ScriptedPartner.status, ScriptedPartner.retry_after = 429, http_date(then.timestamp())
    intent = claimed(scripted)

    with pytest.raises(Retry) as raised:
        run_webhook(intent)

    assert raised.value.after == then
    assert_untouched_while_running(intent)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("status", "header", "message"),
    [
        (429, None, "answered HTTP 429$"),
        (503, None, "answered HTTP 503$"),
        (429, "soon", "HTTP 429 with an unusable Retry-After 'soon'"),
        (503, "-5", "HTTP 503 with an unusable Retry-After '-5'"),
        (500, "7", "answered HTTP 500$"),  # only 429 and 503 snooze
    ],
)
def test_a_refusal_without_a_usable_retry_after_is_an_ordinary_failure(
    scripted: str, status: int, header: str | None, message: str
):
    ScriptedPartner.status, ScriptedPartner.retry_after = status, header
    intent = claimed(scripted)

    with pytest.raises(DeliveryFailed, match=message):
        run_webhook(intent)
    assert_untouched_while_running(intent)


# -- the partner page ---------------------------------------------------------------------


def switch(client: Client, mode: str, **fields: Any) -> Any:
    data = {"mode": mode, "rate": "2", "retry_after": "10", **fields}
    return client.post(reverse("shop:partner"), data)


@pytest.mark.django_db
def test_the_front_page_links_to_the_partner_page_and_names_its_mode(client: Client):
    html = client.get(reverse("shop:index")).content.decode()

    assert f'href="{reverse("shop:partner")}"' in html
    assert escape(Partner.Mode.NORMAL.label) in html


@pytest.mark.django_db
def test_the_partner_page_offers_every_mode_in_a_csrf_protected_form(client: Client):
    response = client.get(reverse("shop:partner"))

    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="csrfmiddlewaretoken"' in html
    for mode in Partner.Mode.values:
        assert f'value="{mode}"' in html
    assert not Partner.objects.exists()  # looking changes nothing


@pytest.mark.django_db
def test_switching_the_partner_stores_its_mode_and_says_so(client: Client):
    response = switch(client, "throttled", retry_after="7", retry_after_as_date="on")

    assert response.status_code == 302
    partner = Partner.objects.get()
    assert (partner.pk, partner.mode, partner.retry_after, partner.retry_after_as_date) == (
        1,
        "throttled",
        7,
        True,
    )
    page = client.get(response.url).content.decode()
    assert "The partner now does this: Always 429 with Retry-After." in page

    switch(client, "normal")

    assert list(Partner.objects.values_list("pk", "mode")) == [(1, "normal")]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "field"),
    [({"mode": "bogus"}, "mode"), ({"rate": "0"}, "rate"), ({"retry_after": "-1"}, "retry_after")],
)
def test_an_invalid_switch_is_answered_400_and_changes_nothing(
    client: Client, fields: dict[str, str], field: str
):
    response = switch(client, **{"mode": "hang", **fields})

    assert response.status_code == 400
    assert field in response.context["form"].errors
    assert not Partner.objects.exists()


@pytest.mark.django_db
def test_an_empty_switch_is_answered_400_and_changes_nothing(client: Client):
    response = client.post(reverse("shop:partner"), {})

    assert response.status_code == 400
    assert "mode" in response.context["form"].errors
    assert not Partner.objects.exists()


@pytest.mark.django_db
def test_switching_the_partner_needs_the_csrf_token():
    client = Client(enforce_csrf_checks=True)

    assert switch(client, "hang").status_code == 403
    assert not Partner.objects.exists()


# -- the receiver obeys the partner page --------------------------------------------------


def set_partner(mode: str, **fields: Any) -> None:
    Partner.objects.update_or_create(pk=Partner.SINGLETON, defaults={"mode": mode, **fields})


def deliver(client: Client, key: str = "k1", query: str = "") -> Any:
    return client.post(
        RECEIVER + query,
        "{}",
        content_type="application/json",
        headers={"Idempotency-Key": key, "Intent-Attempt": "1"},
    )


@pytest.fixture
def fresh_limiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limiter of its own, with a minute's window: a slow machine cannot slip past it."""
    monkeypatch.setattr(shop_views, "rate_limiter", SlidingWindow(window=60))


@pytest.mark.django_db
def test_a_throttled_partner_answers_429_with_retry_after_in_seconds(client: Client):
    set_partner("throttled", retry_after=7)

    response = deliver(client)

    assert (response.status_code, response["Retry-After"]) == (429, "7")
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db
def test_a_throttled_partner_can_send_retry_after_as_an_http_date(client: Client):
    set_partner("throttled", retry_after=120, retry_after_as_date=True)
    before = timezone.now().replace(microsecond=0)

    response = deliver(client)

    assert response.status_code == 429
    asked = parsedate_to_datetime(response["Retry-After"])
    assert before + timedelta(seconds=120) <= asked <= timezone.now() + timedelta(seconds=120)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_limiter")
def test_a_rate_limited_partner_answers_429_only_above_its_rate(client: Client):
    set_partner("limited", rate=2, retry_after=3)

    answers = [deliver(client, f"k{n}") for n in range(4)]

    assert [answer.status_code for answer in answers] == [200, 200, 429, 429]
    assert [answer.get("Retry-After") for answer in answers] == [None, None, "3", "3"]
    assert sorted(ReceivedWebhook.objects.values_list("key", flat=True)) == ["k0", "k1"]


@pytest.mark.django_db
@override_settings(SHOP_PARTNER_HANG=0.3)
def test_a_hanging_partner_answers_503_after_the_hang_and_stores_nothing(client: Client):
    set_partner("hang")
    started = time.monotonic()

    response = deliver(client)

    assert time.monotonic() - started >= 0.3
    assert response.status_code == 503
    assert "Retry-After" not in response
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db
def test_a_partner_switched_back_to_normal_answers_as_the_query_says(client: Client):
    set_partner("normal")

    assert deliver(client, "k1").status_code == 200
    assert deliver(client, "k2", "?status=410").status_code == 410
    assert list(ReceivedWebhook.objects.values_list("key", flat=True)) == ["k1"]


def test_the_sliding_window_refuses_above_the_limit_and_counts_only_what_it_accepts():
    clock = [100.0]
    window = SlidingWindow(window=1.0, clock=lambda: clock[0])

    assert [window.allow(2) for _ in range(3)] == [True, True, False]
    clock[0] += 0.5
    assert not window.allow(2)
    clock[0] += 0.5  # the first two are a full window old
    assert [window.allow(2) for _ in range(3)] == [True, True, False]


# -- a worker pool against the switched partner -------------------------------------------


@contextlib.contextmanager
def hung_request_finishing() -> Iterator[threading.Event]:
    """Wait on leaving for the live server to finish the hung request.

    Its thread touches the database once the hang ends (Django closes old
    connections when a request finishes); left running, it would do that after
    the test, when database access is blocked. Connected after Django's own
    receiver, the event is set once that is done.
    """
    finished = threading.Event()

    def on_finished(**kwargs: Any) -> None:
        finished.set()

    request_finished.connect(on_finished, dispatch_uid="test_example_partner.hung")
    try:
        yield finished
        finished.wait(30)
    finally:
        request_finished.disconnect(dispatch_uid="test_example_partner.hung")


def drain_webhooks(workers: int = 1) -> None:
    pool = WorkerPool(
        handlers={"webhook": deliver_webhook}, workers=workers, drain=True, handle_signals=False
    )
    assert pool.run() == 0


@pytest.mark.django_db(transaction=True)
def test_a_pool_snoozes_a_webhook_the_partner_answers_429_and_it_is_not_a_failed_attempt(
    live_server: Any,
):
    set_partner("throttled", retry_after=30)
    snoozed = Intent.objects.enqueue("webhook", "order-1-placed", live_server.url + RECEIVER, {})
    before = server_now()

    # One attempt allowed: an ordinary failure would cancel the intent.
    with override_settings(INTENTS=intents(MAX_ATTEMPTS=1)):
        drain_webhooks()

    row = Intent.objects.get(pk=snoozed)
    assert (row.state, row.attempts, row.snoozes) == ("pending", 1, 1)
    assert row.last_error == "partner answered 429 with Retry-After: 30"
    assert before + timedelta(seconds=30) <= row.next_at <= timezone.now() + timedelta(seconds=30)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_pool_snoozes_until_the_http_date_the_partner_names(live_server: Any):
    set_partner("throttled", retry_after=120, retry_after_as_date=True)
    snoozed = Intent.objects.enqueue("webhook", "order-1-placed", live_server.url + RECEIVER, {})
    before = timezone.now().replace(microsecond=0)

    drain_webhooks()

    row = Intent.objects.get(pk=snoozed)
    assert (row.state, row.attempts, row.snoozes) == ("pending", 1, 1)
    assert row.last_error.startswith("partner answered 429 with Retry-After: ")
    assert row.last_error.endswith(" GMT")
    assert before + timedelta(seconds=120) <= row.next_at <= timezone.now() + timedelta(seconds=120)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_limiter")
def test_a_pool_delivers_up_to_the_partners_rate_and_snoozes_the_rest(live_server: Any):
    set_partner("limited", rate=1, retry_after=30)
    ids = [
        Intent.objects.enqueue("webhook", f"order-{n}-placed", live_server.url + RECEIVER, {})
        for n in range(3)
    ]

    drain_webhooks(workers=3)

    rows = list(Intent.objects.filter(pk__in=ids))
    done = [row for row in rows if row.state == "completed"]
    snoozed = [row for row in rows if row.state == "pending"]
    assert len(done) == 1
    assert [(row.attempts, row.snoozes) for row in snoozed] == [(1, 1), (1, 1)]
    assert {row.last_error for row in snoozed} == {"partner answered 429 with Retry-After: 30"}
    assert list(ReceivedWebhook.objects.values_list("key", flat=True)) == [done[0].id]


@pytest.mark.django_db(transaction=True)
@override_settings(SHOP_PARTNER_HANG=3.0)
def test_a_pool_fails_an_attempt_whose_partner_hangs_past_the_timeout(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(shop_handlers, "TIMEOUT", 0.3)
    set_partner("hang")
    hung = Intent.objects.enqueue("webhook", "order-1-placed", live_server.url + RECEIVER, {})
    started = time.monotonic()

    with hung_request_finishing() as finished:
        drain_webhooks()
        elapsed, drained_at = time.monotonic() - started, timezone.now()

    assert finished.is_set()
    assert elapsed < 3  # the handler's timeout fired, not the hang's end
    row = Intent.objects.get(pk=hung)
    assert (row.state, row.attempts, row.snoozes) == ("pending", 1, 0)
    assert "DeliveryFailed" in row.last_error
    assert "did not answer within 0.3 s" in row.last_error
    assert row.next_at > drained_at  # retried after the backoff
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_pool_fails_an_attempt_whose_retry_after_is_unusable(scripted: str):
    ScriptedPartner.status, ScriptedPartner.retry_after = 429, "tomorrow"
    failed = Intent.objects.enqueue("webhook", "order-1-placed", scripted, {})

    with override_settings(INTENTS=intents(MAX_ATTEMPTS=1)):
        drain_webhooks()

    row = Intent.objects.get(pk=failed)
    assert (row.state, row.attempts, row.snoozes) == ("cancelled", 1, 0)
    assert "unusable Retry-After 'tomorrow'" in row.last_error
