"""The example shop (example_project/shop): what a Django team copies from it must hold.

Views, signals and the ``send_receipt`` task enqueue in the caller's transaction;
the receiver stores each delivery once; the handlers deliver over real HTTP and
map answers to outcomes; the task sends one receipt however often it runs.

The shop is installed for this module only, with its own migration, by the
``shop_app`` fixture of tests/shoputil.py.
"""

from __future__ import annotations

import asyncio
import http.server
import inspect
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any, ClassVar

import aiohttp
import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_intents import Attempt, ClaimLost, Stop, intent_id
from django_intents.models import Intent
from django_intents.tasks.compat import TaskResultStatus, task_enqueued
from django_intents.tasks.runner import run_task
from django_intents.worker.pool import WorkerPool
from example_project.settings import SQLITE_OPTIONS, database_from_url

from .shoputil import shop_app  # noqa: F401 - an autouse fixture: installs the shop

# Model classes can only be defined while their app is installed: import the shop
# during a brief installation (no admin, so nothing registers globally); the
# shop_app fixture installs it again, with these same classes, while tests run.
with override_settings(INSTALLED_APPS=["django_intents", "example_project.shop"]):
    from example_project.shop import handlers as shop_handlers
    from example_project.shop.handlers import DeliveryFailed, deliver_webhook, send_push
    from example_project.shop.models import Order, PushLog, Receipt, ReceivedWebhook
    from example_project.shop.tasks import send_receipt
    from example_project.shop.views import refuses

RECEIVER = "/webhooks/receive/"
SEND_RECEIPT = "example_project.shop.tasks.send_receipt"


class Boom(Exception):
    pass


def order_form(**overrides: str) -> dict[str, str]:
    return {
        "customer": "ada@example.com",
        "item": "Burr grinder",
        "total": "89.00",
        "partner": "ok",
        **overrides,
    }


def place(**overrides: Any) -> Order:
    fields: dict[str, Any] = {
        "customer": "ada@example.com",
        "item": "Burr grinder",
        "total": Decimal("89.00"),
        "partner_url": "http://testserver/webhooks/receive/",
        **overrides,
    }
    return Order.objects.place(**fields)


# -- the view: an order and its webhook commit together ----------------------------------


@pytest.mark.django_db
def test_placing_an_order_records_exactly_one_webhook_to_the_shops_own_receiver(client: Client):
    response = client.post(reverse("shop:place-order"), order_form())

    assert response.status_code == 302
    order = Order.objects.get()
    webhook = Intent.objects.get(kind="webhook")
    assert webhook.event_id == f"order-{order.pk}-placed"
    assert webhook.target == "http://testserver/webhooks/receive/"
    assert webhook.payload == {"event": "order.placed", "order": order.as_json()}
    assert webhook.payload["order"]["total"] == "89.00"
    assert webhook.state == "pending"
    assert Intent.objects.filter(kind="push").count() == 1


@pytest.mark.django_db
def test_placing_an_order_enqueues_exactly_one_receipt_task_for_it(client: Client):
    client.post(reverse("shop:place-order"), order_form())

    order = Order.objects.get()
    task = Intent.objects.get(kind="django.tasks")
    assert (task.target, task.state) == (SEND_RECEIPT, "pending")
    result = send_receipt.get_result(task.id)
    assert (result.status, result.args, result.kwargs) == (TaskResultStatus.READY, [order.pk], {})
    assert not Receipt.objects.exists()  # a worker sends it


@pytest.mark.django_db
def test_the_chosen_partner_behaviour_is_the_webhook_targets_query(client: Client):
    client.post(reverse("shop:place-order"), order_form(partner="gone"))

    assert Intent.objects.get(kind="webhook").target.endswith(f"{RECEIVER}?status=410")


@pytest.mark.django_db
def test_an_invalid_order_form_is_answered_400_and_records_nothing(client: Client):
    response = client.post(reverse("shop:place-order"), order_form(total="-5"))

    assert response.status_code == 400
    assert "total" in response.context["form"].errors
    assert not Order.objects.exists()
    assert not Intent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_view_failing_after_enqueueing_leaves_neither_order_nor_intents(
    client: Client, monkeypatch: pytest.MonkeyPatch
):
    enqueue = Intent.objects.enqueue

    def enqueue_then_fail_on_the_webhook(kind: str, *args: Any, **kwargs: Any) -> str:
        if kind == "webhook":
            # By now the order and its push (post_save) are written.
            assert Order.objects.exists()
            assert Intent.objects.filter(kind="push").exists()
            raise Boom("the webhook could not be recorded")
        return enqueue(kind, *args, **kwargs)

    monkeypatch.setattr(Intent.objects, "enqueue", enqueue_then_fail_on_the_webhook)

    with pytest.raises(Boom):
        client.post(reverse("shop:place-order"), order_form())

    assert not Order.objects.exists()
    assert not Intent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_view_failing_after_enqueueing_the_receipt_leaves_neither_order_nor_intents(
    client: Client,
):
    def fail_once_the_task_is_stored(sender: Any, task_result: Any, **kwargs: Any) -> None:
        # Sent by enqueue after its INSERT, inside the view's transaction.
        assert Intent.objects.filter(pk=task_result.id, kind="django.tasks").exists()
        assert Order.objects.exists()
        raise Boom("the view failed after enqueueing the receipt")

    task_enqueued.connect(fail_once_the_task_is_stored, dispatch_uid="test_example.fail")
    try:
        with pytest.raises(Boom):
            client.post(reverse("shop:place-order"), order_form())
    finally:
        task_enqueued.disconnect(dispatch_uid="test_example.fail")

    assert not Order.objects.exists()
    assert not Intent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_inline_push_is_written_by_the_view_and_its_intent_completed_with_it(client: Client):
    client.post(reverse("shop:place-order"), order_form(push_inline="on"))

    push = Intent.objects.get(kind="push")
    assert push.state == "completed"
    assert push.attempts == 0  # no worker ever claimed it
    log = PushLog.objects.get()
    assert log.intent_id == push.id
    assert log.sent_by == "inline"
    assert Intent.objects.get(kind="webhook").state == "pending"


@pytest.mark.django_db(transaction=True)
def test_an_inline_push_is_not_written_when_a_worker_already_holds_the_intent():
    order = Order.objects.create(customer="ada@example.com", item="Tamper", total=Decimal(25))
    claimed = Intent.objects.claim(kinds=["push"])
    assert claimed is not None

    # What place(push_inline=True) does, for an intent a worker has claimed:
    assert not Intent.objects.complete_pending(intent_id(*order.push_intent()))
    assert Intent.objects.get(pk=claimed.pk).state == "running"


# -- the signal: a saved order records its push -----------------------------------------


@pytest.mark.django_db
def test_saving_a_new_order_records_exactly_one_push():
    with transaction.atomic():
        order = Order.objects.create(customer="grace@example.com", item="Beans", total=Decimal(18))

    push = Intent.objects.get()
    assert (push.kind, push.event_id, push.target) == (
        "push",
        f"order-{order.pk}-placed",
        "customer:grace@example.com",
    )
    assert push.payload == {"order": order.pk, "message": f"Order #{order.pk} placed: Beans"}


@pytest.mark.django_db
def test_saving_an_order_again_without_a_status_change_records_nothing_more():
    order = Order.objects.create(customer="grace@example.com", item="Beans", total=Decimal(18))
    order.item = "Decaf beans"
    order.save()

    assert Intent.objects.count() == 1


@pytest.mark.django_db
def test_shipping_an_order_records_a_second_push():
    order = Order.objects.create(customer="grace@example.com", item="Beans", total=Decimal(18))
    order.status = Order.Status.SHIPPED
    order.save()

    assert sorted(Intent.objects.values_list("event_id", flat=True)) == [
        f"order-{order.pk}-placed",
        f"order-{order.pk}-shipped",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_save_records_no_push():
    with pytest.raises(Boom), transaction.atomic():
        Order.objects.create(customer="grace@example.com", item="Beans", total=Decimal(18))
        assert Intent.objects.count() == 1  # recorded, inside the transaction
        raise Boom

    assert not Order.objects.exists()
    assert not Intent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_place_records_no_webhook_either():
    with pytest.raises(Boom), transaction.atomic():
        place()
        raise Boom

    assert not Order.objects.exists()
    assert not Intent.objects.exists()


@pytest.mark.django_db
def test_the_admins_mark_shipped_action_records_a_push_per_order_shipped(admin_client: Client):
    placed = [place(item="Tamper"), place(item="Milk jug")]
    shipped = place(item="Scale")
    shipped.status = Order.Status.SHIPPED
    shipped.save()
    selected = [str(order.pk) for order in [*placed, shipped]]

    response = admin_client.post(
        reverse("admin:shop_order_changelist"),
        {"action": "mark_shipped", "_selected_action": selected},
        follow=True,
    )

    assert "2 orders shipped" in response.content.decode()
    assert set(Order.objects.values_list("status", flat=True)) == {"shipped"}
    events = set(Intent.objects.filter(kind="push").values_list("event_id", flat=True))
    assert {f"order-{order.pk}-shipped" for order in placed} <= events
    assert Intent.objects.filter(kind="push", event_id__endswith="-shipped").count() == 3


# -- the task: one receipt per order ------------------------------------------------------


@pytest.mark.django_db
def test_the_receipt_task_sends_one_receipt_however_often_it_runs():
    order = place(item="Scale")

    first = send_receipt.call(order.pk)
    again = send_receipt.call(order.pk)  # at least once: a second run after a lost lease

    receipt = Receipt.objects.get()
    assert first == again == {"receipt": receipt.pk, "sent_to": "ada@example.com"}
    assert (receipt.order, receipt.text) == (
        order,
        f"Thank you for order #{order.pk}: Scale, 89.00",
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_pool_runs_the_views_receipt_task_and_its_result_reads_back(client: Client):
    client.post(reverse("shop:place-order"), order_form())
    task = Intent.objects.get(kind="django.tasks")
    pool = WorkerPool(handlers={"django.tasks": run_task}, drain=True, handle_signals=False)

    assert pool.run() == 0

    result = send_receipt.get_result(task.id)
    receipt = Receipt.objects.get()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"receipt": receipt.pk, "sent_to": "ada@example.com"}
    assert receipt.order == Order.objects.get()
    assert Intent.objects.filter(kind__in=["webhook", "push"], state="pending").count() == 2


# -- the receiver: each delivery stored once ---------------------------------------------


def deliver(client: Client, key: str, query: str = "", attempt: int = 1, body: str = "{}") -> Any:
    return client.post(
        RECEIVER + query,
        body,
        content_type="application/json",
        headers={"Idempotency-Key": key, "Intent-Attempt": str(attempt)},
    )


@pytest.mark.django_db
def test_the_receiver_stores_a_delivery_once_and_answers_a_duplicate_with_200():
    client = Client(enforce_csrf_checks=True)  # partners have no CSRF cookie

    first = deliver(client, "k1", body='{"event": "order.placed"}')
    again = deliver(client, "k1", attempt=2, body='{"event": "order.placed"}')

    assert (first.status_code, first.json()["duplicate"]) == (200, False)
    assert (again.status_code, again.json()["duplicate"]) == (200, True)
    stored = ReceivedWebhook.objects.get()
    assert (stored.key, stored.payload, stored.attempt, stored.deliveries) == (
        "k1",
        {"event": "order.placed"},
        1,
        2,
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "body", "status"),
    [("?fail=1", "{}", 503), ("?status=410", "{}", 410), ("", "not json", 400)],
)
def test_the_receiver_stores_nothing_it_refuses(client: Client, query: str, body: str, status: int):
    assert deliver(client, "k1", query, body=body).status_code == status
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db
def test_the_receiver_needs_an_idempotency_key(client: Client):
    response = client.post(RECEIVER, "{}", content_type="application/json")

    assert response.status_code == 400
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db
def test_the_receiver_accepts_only_post(client: Client):
    assert client.get(RECEIVER).status_code == 405


@pytest.mark.django_db
def test_the_receiver_told_to_fail_first_attempts_accepts_the_next_one(client: Client):
    assert deliver(client, "k1", "?fail_first=2", attempt=1).status_code == 503
    assert deliver(client, "k1", "?fail_first=2", attempt=2).status_code == 503
    assert deliver(client, "k1", "?fail_first=2", attempt=3).status_code == 200
    assert ReceivedWebhook.objects.get().attempt == 3


@pytest.mark.django_db
def test_the_receivers_default_failure_rate_comes_from_the_setting(client: Client):
    with override_settings(SHOP_RECEIVER_FAIL=1.0):
        assert deliver(client, "k1").status_code == 503
    assert deliver(client, "k1").status_code == 200


def test_a_flaky_receiver_refuses_about_the_requested_fraction_and_always_the_same_ones():
    keys = [intent_id("webhook", f"order-{n}-placed", "http://partner/") for n in range(2000)]
    refused = [key for key in keys if refuses(key, 1, 0.3)]

    assert 0.26 < len(refused) / len(keys) < 0.34
    assert refused == [key for key in keys if refuses(key, 1, 0.3)]
    assert not any(refuses(key, 1, 0.0) for key in keys)
    assert all(refuses(key, 1, 1.0) for key in keys)
    # A refused delivery gets another chance on the next attempt.
    assert any(not refuses(key, 2, 0.3) for key in refused)


# -- pages --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_front_page_shows_orders_and_their_intents(client: Client):
    order = place(item="Knock box")

    response = client.get(reverse("shop:index"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "Knock box" in html
    assert f"order-{order.pk}-placed" in html
    assert 'name="csrfmiddlewaretoken"' in html


@pytest.mark.django_db
def test_the_status_endpoint_counts_intents_per_kind_and_state(client: Client):
    place(push_inline=True)

    status = client.get(reverse("shop:status")).json()

    assert status["intents"] == {
        "push": {"pending": 0, "running": 0, "completed": 1, "cancelled": 0},
        "webhook": {"pending": 1, "running": 0, "completed": 0, "cancelled": 0},
    }
    assert status["next_due_in"] == 0
    assert status["pushes_sent"] == 1
    assert status["receipts_sent"] == 0


# -- the handlers, against the receiver over real HTTP ------------------------------------


def claimed(target: str, event_id: str = "order-1-placed", **claim: Any) -> Intent:
    Intent.objects.enqueue("webhook", event_id, target, {"event": "order.placed"})
    intent = Intent.objects.claim(kinds=["webhook"], **claim)
    assert intent is not None
    return intent


def run_webhook(intent: Intent, attempt: Attempt | None = None) -> None:
    """Await the async webhook handler on a loop of its own, as a unit test of it does."""
    asyncio.run(deliver_webhook(intent, attempt or Attempt(intent)))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlowPartner(http.server.BaseHTTPRequestHandler):
    """Answers 200 only after ``delay`` seconds (or once ``release`` is set)."""

    delay = 30.0
    release = threading.Event()
    requests: ClassVar[list[str]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(self.headers.get("Idempotency-Key") or "")
        self.release.wait(self.delay)
        try:
            self.send_response(200)
            self.end_headers()
        except OSError:  # the client gave up long ago
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass


@pytest.fixture
def slow_partner(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real HTTP server that hangs far longer than the handler's timeout, cut to 0.5 s."""
    monkeypatch.setattr(shop_handlers, "TIMEOUT", 0.5)
    SlowPartner.release = threading.Event()
    SlowPartner.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowPartner)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        SlowPartner.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_webhook_handler_is_a_coroutine_function_the_pool_awaits():
    assert inspect.iscoroutinefunction(deliver_webhook)


@pytest.mark.django_db(transaction=True)
def test_the_webhook_handler_delivers_with_the_intent_id_as_idempotency_key(live_server: Any):
    intent = claimed(live_server.url + RECEIVER)

    assert run_webhook(intent) is None

    stored = ReceivedWebhook.objects.get()
    assert (stored.key, stored.payload, stored.attempt) == (intent.id, intent.payload, 1)


@pytest.mark.django_db(transaction=True)
def test_deliveries_on_one_loop_share_one_session_and_it_closes_with_the_loop(live_server: Any):
    first = claimed(live_server.url + RECEIVER, "order-1-placed")
    second = claimed(live_server.url + RECEIVER, "order-2-placed")
    seen: list[Any] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def both() -> None:
        loops.append(asyncio.get_running_loop())
        await deliver_webhook(first, Attempt(first))
        seen.append(await shop_handlers.shared_session())
        await deliver_webhook(second, Attempt(second))
        seen.append(await shop_handlers.shared_session())

    asyncio.run(both())

    assert seen[0] is seen[1]
    assert seen[0].closed  # closed by asyncio.run's shutdown, not left for the collector
    assert loops[0] not in shop_handlers._sessions
    assert sorted(ReceivedWebhook.objects.values_list("key", flat=True)) == sorted(
        [first.id, second.id]
    )


@pytest.mark.django_db(transaction=True)
def test_a_redelivery_after_a_lost_lease_is_stored_once(live_server: Any):
    first = claimed(live_server.url + RECEIVER, lease=1)
    run_webhook(first)
    # The worker died before recording the result; another one takes over.
    second = Intent.objects.claim(kinds=["webhook"], now=timezone.now() + timedelta(seconds=5))
    assert second is not None
    assert (second.id, second.attempts) == (first.id, 2)

    run_webhook(second)

    stored = ReceivedWebhook.objects.get()
    assert (stored.key, stored.attempt, stored.deliveries) == (first.id, 1, 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [400, 404, 410, 422])
def test_a_4xx_answer_stops_the_intent(live_server: Any, status: int):
    intent = claimed(f"{live_server.url}{RECEIVER}?status={status}")

    with pytest.raises(Stop, match=f"HTTP {status}"):
        run_webhook(intent)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("query", ["?fail=1", "?status=500", "?status=429"])
def test_a_5xx_or_429_answer_raises_for_a_retry(live_server: Any, query: str):
    intent = claimed(f"{live_server.url}{RECEIVER}{query}")

    with pytest.raises(DeliveryFailed, match="HTTP"):
        run_webhook(intent)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_redirect_is_retried_not_followed_as_a_get(live_server: Any):
    # CommonMiddleware answers 301 to a POST on the URL without its slash.
    intent = claimed(live_server.url + RECEIVER.rstrip("/"))

    with pytest.raises(DeliveryFailed, match="HTTP 301"):
        run_webhook(intent)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_partner_raises_for_a_retry():
    intent = claimed(f"http://127.0.0.1:{closed_port()}/hook")

    with pytest.raises(aiohttp.ClientConnectionError):
        run_webhook(intent)


@pytest.mark.django_db(transaction=True)
def test_a_target_that_is_not_http_is_stopped_without_a_request():
    intent = claimed("file:///etc/passwd")

    with pytest.raises(Stop, match="not an http"):
        run_webhook(intent)


@pytest.mark.django_db(transaction=True)
def test_an_attempt_cancelled_before_the_request_sends_nothing(live_server: Any):
    intent = claimed(live_server.url + RECEIVER)
    attempt = Attempt(intent)
    attempt.cancelled.set()  # what the pool does when the claim is lost or it shuts down

    with pytest.raises(ClaimLost):
        run_webhook(intent, attempt)
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_partner_that_hangs_past_the_timeout_fails_the_attempt_in_time(slow_partner: str):
    intent = claimed(slow_partner)
    started = time.monotonic()

    with pytest.raises(DeliveryFailed, match=r"did not answer within 0\.5 s"):
        run_webhook(intent)

    assert time.monotonic() - started < 5  # the partner would have taken 30 s
    assert SlowPartner.requests == [intent.id]
    row = Intent.objects.get(pk=intent.pk)
    assert (row.state, row.attempts) == ("running", 1)  # nothing recorded without a pool


@pytest.mark.django_db(transaction=True)
def test_a_worker_pool_retries_a_webhook_whose_partner_hangs_past_the_timeout(slow_partner: str):
    hung = Intent.objects.enqueue("webhook", "order-1-placed", slow_partner, {"n": 1})
    pool = WorkerPool(
        handlers={"webhook": deliver_webhook}, workers=1, drain=True, handle_signals=False
    )
    started = time.monotonic()

    assert pool.run() == 0

    assert time.monotonic() - started < 10  # the partner would have taken 30 s
    row = Intent.objects.get(pk=hung)
    assert (row.state, row.attempts) == ("pending", 1)
    assert "DeliveryFailed" in row.last_error
    assert "did not answer within 0.5 s" in row.last_error
    assert row.next_at > timezone.now()
    assert SlowPartner.requests == [hung]
    assert not ReceivedWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_pool_completes_cancels_and_retries_webhooks_by_the_partners_answer(
    live_server: Any,
):
    receiver = live_server.url + RECEIVER
    ok = Intent.objects.enqueue("webhook", "order-1-placed", receiver, {"n": 1})
    gone = Intent.objects.enqueue("webhook", "order-2-placed", receiver + "?status=410", {"n": 2})
    down = Intent.objects.enqueue("webhook", "order-3-placed", receiver + "?fail=1", {"n": 3})
    pool = WorkerPool(
        handlers={"webhook": deliver_webhook}, workers=3, drain=True, handle_signals=False
    )

    assert pool.run() == 0

    rows = {row.id: row for row in Intent.objects.all()}
    assert rows[ok].state == "completed"
    assert (rows[gone].state, rows[gone].attempts) == ("cancelled", 1)
    assert "HTTP 410" in rows[gone].last_error
    assert (rows[down].state, rows[down].attempts) == ("pending", 1)
    assert "DeliveryFailed" in rows[down].last_error
    assert "HTTP 503" in rows[down].last_error
    assert rows[down].next_at > timezone.now()
    assert list(ReceivedWebhook.objects.values_list("key", flat=True)) == [ok]


@pytest.mark.django_db(transaction=True)
def test_the_push_handler_writes_its_log_and_completes_the_intent_together():
    order = place()
    push = Intent.objects.claim(kinds=["push"])
    assert push is not None

    send_push(push, Attempt(push))

    log = PushLog.objects.get()
    assert (log.intent_id, log.recipient, log.sent_by) == (push.id, push.target, "worker")
    assert log.message == f"Order #{order.pk} placed: Burr grinder"
    assert Intent.objects.get(pk=push.pk).state == "completed"


@pytest.mark.django_db(transaction=True)
def test_the_push_handler_writes_nothing_when_its_claim_was_lost_meanwhile():
    place()
    push = Intent.objects.claim(kinds=["push"])
    assert push is not None
    assert Intent.objects.retry_now(push.id)  # an administrator fences the claim

    with pytest.raises(ClaimLost):
        send_push(push, Attempt(push))

    assert not PushLog.objects.exists()
    assert Intent.objects.get(pk=push.pk).state == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_push_without_a_message_is_stopped():
    Intent.objects.enqueue("push", "order-9-placed", "customer:ken@example.com", {"order": 9})
    push = Intent.objects.claim(kinds=["push"])
    assert push is not None

    with pytest.raises(Stop, match="no message"):
        send_push(push, Attempt(push))
    assert not PushLog.objects.exists()


# -- settings: DATABASE_URL --------------------------------------------------------------


def test_a_postgres_url_becomes_a_postgresql_database_with_decoded_credentials():
    database = database_from_url(
        "postgres://shop:p%40ss%2Fword@db.internal:5433/shop?sslmode=require"
    )

    assert database == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "shop",
        "USER": "shop",
        "PASSWORD": "p@ss/word",
        "HOST": "db.internal",
        "PORT": "5433",
        "OPTIONS": {"sslmode": "require"},
    }


@pytest.mark.parametrize("scheme", ["mysql", "mariadb"])
def test_a_mysql_or_mariadb_url_becomes_a_utf8mb4_mysql_database(scheme: str):
    database = database_from_url(f"{scheme}://root@127.0.0.1/shop")

    assert database["ENGINE"] == "django.db.backends.mysql"
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == ("shop", "root", "")
    assert (database["HOST"], database["PORT"]) == ("127.0.0.1", "")
    assert database["OPTIONS"] == {"charset": "utf8mb4"}


def test_a_sqlite_url_keeps_the_absolute_path_and_the_wal_options():
    database = database_from_url("sqlite:////var/lib/shop/db.sqlite3")

    assert database["NAME"] == "/var/lib/shop/db.sqlite3"
    assert database["OPTIONS"] == SQLITE_OPTIONS
    assert "journal_mode=WAL" in database["OPTIONS"]["init_command"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("oracle://db/shop", "scheme 'oracle'"),
        ("postgres://db.internal", "needs a database name"),
        ("sqlite://", "needs a path"),
    ],
)
def test_an_unusable_database_url_is_refused_naming_the_problem(url: str, message: str):
    with pytest.raises(ValueError, match=message):
        database_from_url(url)
