"""The shop's handlers, found by the worker pool at start-up (like ``admin.py``).

Both run at least once: a worker may die after the effect and before recording
it, and then the intent runs again. Each handler makes a second run harmless in
its own way: the webhook carries the intent id as its ``Idempotency-Key`` for the
partner to de-duplicate on; the push writes its row and completes its intent in
one transaction (``attempt.atomic()``), so it happens exactly once.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django_intents import Stop, handler

from .models import PushLog

if TYPE_CHECKING:
    from django_intents import Attempt
    from django_intents.models import Intent

# Well below the lease (INTENTS["LEASE"]), so a hung partner costs one attempt,
# not the claim.
TIMEOUT = 5.0
USER_AGENT = "django-intents-example/1"


class DeliveryFailed(Exception):
    """The partner did not take the delivery this time (5xx, 429, 3xx); retry later."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Report redirects as they are; urllib would turn a redirected POST into a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


@handler("webhook")
def deliver_webhook(intent: Intent, attempt: Attempt) -> None:
    """POST the payload as JSON to ``intent.target``; 2xx is done, 4xx (but 429) is final."""
    if urlsplit(intent.target).scheme not in ("http", "https"):
        raise Stop(f"not an http(s) URL: {intent.target}")
    request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
        intent.target,
        data=json.dumps(intent.payload).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            # The partner stores each key once: a retried delivery is harmless.
            "Idempotency-Key": intent.id,
            "Intent-Attempt": str(intent.attempts),
        },
    )
    attempt.check()  # do not start a delivery for a claim that is already lost
    try:
        with _opener.open(request, timeout=TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
        error.close()
    # Network errors (refused, reset, timeout) propagate as they are: retry.
    if 200 <= status < 300:
        return
    if 400 <= status < 500 and status != 429:
        raise Stop(f"{intent.target} refused the delivery: HTTP {status}")
    raise DeliveryFailed(f"{intent.target} answered HTTP {status}")


@handler("push")
def send_push(intent: Intent, attempt: Attempt) -> None:
    """Send the push (a row in PushLog) and complete the intent in one transaction.

    If the claim was lost meanwhile (an administrator cancelled the intent, or the
    lease expired and another worker took it), ``attempt.atomic()`` raises
    ``ClaimLost`` and the row rolls back: the customer is notified once.
    """
    message = intent.payload.get("message") if isinstance(intent.payload, dict) else None
    if not message:
        raise Stop("the payload has no message to push")
    with attempt.atomic():
        PushLog.objects.create(
            intent_id=intent.id,
            recipient=intent.target,
            message=message,
            sent_by=PushLog.SentBy.WORKER,
        )
