"""The shop's pages, and a receiver that plays the partner the webhooks go to."""

from __future__ import annotations

import hashlib
import json
import logging
import time

from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.db.models import Count, F, Min, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import http_date
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from django_intents.models import Intent

from .forms import OrderForm, PartnerForm
from .models import Order, Partner, PushLog, Receipt, ReceivedWebhook
from .ratelimit import SlidingWindow
from .tasks import send_receipt

logger = logging.getLogger(__name__)


def index(request: HttpRequest, form: OrderForm | None = None) -> HttpResponse:
    """The shop's front page: a form to place an order, and what became of recent ones."""
    context = {
        "form": form or OrderForm(),
        "orders": Order.objects.all()[:10],
        "intents": Intent.objects.order_by("-created_at", "-id")[:20],
        "states": Intent.State.values,
        "counts": [
            (kind, [by_state[state] for state in Intent.State.values])
            for kind, by_state in _counts().items()
        ],
        "pushes": PushLog.objects.all()[:10],
        "receipts": Receipt.objects.all()[:10],
        "webhooks": ReceivedWebhook.objects.all()[:10],
        "partner": Partner.objects.current(),
    }
    return render(request, "shop/index.html", context, status=400 if form else 200)


@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """Place an order; its webhook, push and receipt task commit with it, or none of them do.

    The webhook and the push are recorded by ``Order.objects.place``; the receipt
    is a ``@task`` enqueued through Django's own task API. ``IntentsBackend``
    stores it in this transaction, so a receipt is never sent for an order that
    rolled back, nor lost for one that committed.
    """
    form = OrderForm(request.POST)
    if not form.is_valid():
        return index(request, form)
    with transaction.atomic():
        order = Order.objects.place(
            customer=form.cleaned_data["customer"],
            item=form.cleaned_data["item"],
            total=form.cleaned_data["total"],
            partner_url=partner_url(request) + form.partner_query(),
            push_inline=form.cleaned_data["push_inline"],
        )
        send_receipt.enqueue(order.pk)
    messages.success(
        request, f"Placed order #{order.pk}; its webhook, push and receipt are on their way."
    )
    return redirect("shop:index")


def partner_url(request: HttpRequest) -> str:
    """Where webhooks go: ``SHOP_PARTNER_URL``, or this site's own receiver."""
    return settings.SHOP_PARTNER_URL or request.build_absolute_uri(reverse("shop:receive-webhook"))


@require_GET
def status(request: HttpRequest) -> JsonResponse:
    """Counts per kind and state, and when the next intent falls due (run.py polls this)."""
    now = timezone.now()
    due = [
        Intent.objects.in_state("pending").aggregate(at=Min("next_at"))["at"],
        Intent.objects.in_state("running").aggregate(at=Min("claim_until"))["at"],
    ]
    next_at = min((at for at in due if at is not None), default=None)
    received = ReceivedWebhook.objects.aggregate(stored=Count("id"), deliveries=Sum("deliveries"))
    return JsonResponse(
        {
            "intents": _counts(),
            "next_due_in": None if next_at is None else max(0.0, (next_at - now).total_seconds()),
            "webhooks_stored": received["stored"],
            "webhook_deliveries": received["deliveries"] or 0,
            "pushes_sent": PushLog.objects.count(),
            "receipts_sent": Receipt.objects.count(),
        }
    )


def _counts() -> dict[str, dict[str, int]]:
    """``{kind: {state: count}}`` with every state present, in one grouped query."""
    counts: dict[str, dict[str, int]] = {}
    rows = Intent.objects.order_by().values_list("kind", "state").annotate(n=Count("id"))
    for kind, state, n in rows:
        counts.setdefault(kind, dict.fromkeys(Intent.State.values, 0))[state] = n
    return dict(sorted(counts.items()))


# -- the partner's side -------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
def partner(request: HttpRequest) -> HttpResponse:
    """Switch how the receiver answers: normally, 429 with ``Retry-After``, or hanging.

    For a person watching flow control in the browser: the mode applies to every
    delivery from the next one on, whatever the webhook URL's query says.
    """
    data = request.POST if request.method == "POST" else None  # an empty POST is invalid too
    form = PartnerForm(data, instance=Partner.objects.current())
    if request.method == "POST" and form.is_valid():
        saved = form.save()
        messages.success(request, f"The partner now does this: {saved.get_mode_display()}.")
        return redirect("shop:partner")
    context = {"form": form, "hang": settings.SHOP_PARTNER_HANG}
    return render(request, "shop/partner.html", context, status=400 if form.errors else 200)


# The rate-limited partner's count of recent deliveries, shared by runserver's threads.
rate_limiter = SlidingWindow()


def refuses(key: str, attempt: int, fraction: float) -> bool:
    """Whether a flaky partner refuses this delivery: ``fraction`` of them, chosen by hash.

    Decided by the idempotency key and the sender's attempt number rather than at
    random, so a demo (and a test) replays the same way every time, and a refused
    delivery may still get through on a later attempt.
    """
    digest = hashlib.sha256(f"{key}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


# Other servers post here, without a CSRF cookie. A real receiver would check a
# signature of the body instead; the Idempotency-Key only de-duplicates.
@csrf_exempt
@require_POST
def receive_webhook(request: HttpRequest) -> JsonResponse:
    """Accept a webhook once per ``Idempotency-Key``; a duplicate is answered 200 and not stored.

    First the mode set on the partner page: it may answer 429 with
    ``Retry-After``, or hang for ``SHOP_PARTNER_HANG`` seconds and then answer
    503. Then the query: ``?status=410`` answers that status instead (a partner
    that refuses for good); ``?fail=0.3`` refuses that fraction of deliveries
    with 503 (default ``SHOP_RECEIVER_FAIL``), and ``?fail_first=1`` the first
    attempt of each, so that retries and backoff can be watched.
    """
    key = request.headers.get("Idempotency-Key", "")
    if not key or len(key) > ReceivedWebhook._meta.get_field("key").max_length:
        return _refuse(400, "an Idempotency-Key header of 1 to 255 characters is required", key)
    try:
        attempt = int(request.headers.get("Intent-Attempt", "0"))
        forced = int(request.GET.get("status", "0"))
        fraction = float(request.GET.get("fail", settings.SHOP_RECEIVER_FAIL))
        fail_first = int(request.GET.get("fail_first", "0"))
    except ValueError:
        return _refuse(400, "Intent-Attempt and the query parameters must be numbers", key)
    # Read before any answer: a hanging partner that left the body unread in the
    # socket would have runserver parse it as the next request once it answers.
    body = request.body
    refused = _as_the_partner_page_says(Partner.objects.current(), key, attempt)
    if refused is not None:
        return refused
    if forced:
        return _refuse(forced if 400 <= forced < 600 else 400, "refused by ?status", key, attempt)
    if attempt <= fail_first:
        return _refuse(503, f"refused by ?fail_first={fail_first}", key, attempt)
    if refuses(key, attempt, fraction):
        return _refuse(503, f"refused by ?fail={fraction:g}", key, attempt)
    try:
        payload = json.loads(body)
    except ValueError:
        return _refuse(400, "the body is not JSON", key, attempt)

    webhook, created = ReceivedWebhook.objects.get_or_create(
        key=key, defaults={"payload": payload, "attempt": attempt}
    )
    if created:
        logger.info("receiver: %s attempt %s -> HTTP 200, stored", key[:12], attempt)
    else:
        ReceivedWebhook.objects.filter(pk=webhook.pk).update(deliveries=F("deliveries") + 1)
        logger.info(
            "receiver: %s attempt %s -> HTTP 200, a duplicate: not stored", key[:12], attempt
        )
    return JsonResponse({"key": key, "duplicate": not created})


def _as_the_partner_page_says(current: Partner, key: str, attempt: int) -> JsonResponse | None:
    """The answer the partner page's mode imposes, or ``None`` to answer as usual."""
    if current.mode == Partner.Mode.HANG:
        # Bounded, so a dev-server thread is not held for ever: by default one
        # second past the handler's 5 s timeout, which fires first.
        time.sleep(settings.SHOP_PARTNER_HANG)
        return _refuse(503, f"hung for {settings.SHOP_PARTNER_HANG:g} s", key, attempt)
    if current.mode == Partner.Mode.THROTTLED or (
        current.mode == Partner.Mode.LIMITED and not rate_limiter.allow(current.rate)
    ):
        response = _refuse(429, current.get_mode_display(), key, attempt)
        if current.retry_after_as_date:
            response["Retry-After"] = http_date(time.time() + current.retry_after)
        else:
            response["Retry-After"] = str(current.retry_after)
        return response
    return None


def _refuse(status: int, why: str, key: str, attempt: int | None = None) -> JsonResponse:
    logger.info("receiver: %s attempt %s -> HTTP %s (%s)", key[:12] or "-", attempt, status, why)
    return JsonResponse({"error": why}, status=status)
