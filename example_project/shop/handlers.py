"""The shop's handlers, found by the worker pool at start-up (like ``admin.py``).

Both run at least once: a worker may die after the effect and before recording
it, and then the intent runs again. Each handler makes a second run harmless in
its own way: the webhook carries the intent id as its ``Idempotency-Key`` for the
partner to de-duplicate on; the push writes its row and completes its intent in
one transaction (``attempt.atomic()``), so it happens exactly once.

The webhook handler is ``async def``: a delivery spends nearly all its time
waiting on the partner, and the pool awaits async handlers on one event loop,
so ``--concurrency`` deliveries can be in flight at once without a thread each.
The push handler stays a plain function; both run in the same pool.

A partner that answers 429 (or 503) with ``Retry-After`` is asking to be called
later, not failing: the webhook handler snoozes the intent with ``Retry(after=...)``,
which never counts toward ``MAX_ATTEMPTS``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

# aiohttp (aio-libs): the fastest well-maintained asyncio HTTP client, with a
# connection pool per session and a timeout per request (ClientTimeout).
import aiohttp
from django.utils import timezone

from django_intents import Retry, Stop, handler

from .models import PushLog

if TYPE_CHECKING:
    from django_intents import Attempt
    from django_intents.models import Intent

# The whole request (connect, send, read the answer) must finish in this many
# seconds. Well below the lease (INTENTS["LEASE"], 30 s by default), so a hung
# partner costs one attempt, not the claim.
TIMEOUT = 5.0
USER_AGENT = "django-intents-example/1"
# The answers whose Retry-After snoozes the intent (RFC 9110 defines it for both).
SNOOZE_STATUSES = (429, 503)
# A partner may ask for any delay, and a buggy one (or a clock a year off) for an
# absurd one; the snoozed intent would sit pending, out of sight, all that time.
# An hour at most: if the partner still wants a break then, it says 429 again.
MAX_RETRY_AFTER = timedelta(hours=1)
DELAY_SECONDS = re.compile(r"[0-9]+")  # RFC 9110 delay-seconds: ASCII digits only


class DeliveryFailed(Exception):
    """The partner did not take the delivery this time (5xx, 429, 3xx, no answer); retry later."""


# One session per event loop: an aiohttp session belongs to the loop it was
# created on, so it is made lazily, from inside a coroutine, the first time a
# delivery runs on that loop (at import time there is no running loop). Beside
# it, the parked generator that closes it when the loop shuts down.
_sessions: dict[asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncGenerator[None]]] = {}


async def _close_with_the_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None]:
    """Keep ``session`` until its loop shuts down, then close it.

    An event loop closes the async generators still suspended when it shuts
    down (``loop.shutdown_asyncgens()``, which ``asyncio.run`` calls), so
    parking this one at its ``yield`` closes the session with the loop instead
    of leaving sockets behind and a ResourceWarning.
    """
    try:
        yield
    finally:
        _sessions.pop(asyncio.get_running_loop(), None)
        await session.close()


async def shared_session() -> aiohttp.ClientSession:
    """The running loop's shared session, created on first use."""
    loop = asyncio.get_running_loop()
    if loop in _sessions and not _sessions[loop][0].closed:
        return _sessions[loop][0]
    session = aiohttp.ClientSession(
        # No connection limit of the session's own: --concurrency already bounds
        # the deliveries in flight, and a request queued for a free connection
        # would spend its timeout waiting for one.
        connector=aiohttp.TCPConnector(limit=0),
        headers={"User-Agent": USER_AGENT},
    )
    keeper = _close_with_the_loop(session)
    _sessions[loop] = (session, keeper)
    await anext(keeper)  # parked at its yield until the loop shuts down
    return session


def retry_after(value: str, now: datetime) -> int | datetime:
    """The delay a ``Retry-After`` header asks for: whole seconds, or an aware datetime.

    The header is delay-seconds (``120``) or an HTTP-date (``Wed, 21 Oct 2026
    07:28:00 GMT``, always GMT). Anything else (``-5``, ``1.5``, ``soon``, an
    empty value) raises ``ValueError``, so that the handler can report it as an
    ordinary failure instead of guessing. Either form is capped at
    ``MAX_RETRY_AFTER`` from ``now``; a date in the past comes back as it is
    (``Retry`` makes it due at once).
    """
    value = value.strip()
    if DELAY_SECONDS.fullmatch(value):
        cap = int(MAX_RETRY_AFTER.total_seconds())
        digits = value.lstrip("0") or "0"
        # Compared by length first: int() refuses strings of over 4,300 digits.
        return cap if len(digits) > len(str(cap)) else min(int(digits), cap)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError) as error:
        raise ValueError("neither seconds nor an HTTP date") from error
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)  # "-0000": UTC, with no local time known
    return min(when, now + MAX_RETRY_AFTER)


@handler("webhook")
async def deliver_webhook(intent: Intent, attempt: Attempt) -> None:
    """POST the payload as JSON to ``intent.target``; 2xx is done, 4xx (but 429) is final.

    429 or 503 with a usable ``Retry-After`` snoozes the intent for that long;
    without one (or with one that makes no sense) they are ordinary failures.
    """
    if urlsplit(intent.target).scheme not in ("http", "https"):
        raise Stop(f"not an http(s) URL: {intent.target}")
    client = await shared_session()
    attempt.check()  # do not start a delivery for a claim that is already lost
    try:
        async with client.post(
            intent.target,
            data=json.dumps(intent.payload).encode(),
            headers={
                "Content-Type": "application/json",
                # The partner stores each key once: a retried delivery is harmless.
                "Idempotency-Key": intent.id,
                "Intent-Attempt": str(intent.attempts),
            },
            # A redirected POST would arrive elsewhere (or as a GET): report it instead.
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        ) as response:
            status = response.status
            asked = response.headers.get("Retry-After")
    except TimeoutError as error:
        raise DeliveryFailed(f"{intent.target} did not answer within {TIMEOUT:g} s") from error
    # Other network errors (refused, reset) propagate as they are: retry.
    if 200 <= status < 300:
        return
    if 400 <= status < 500 and status != 429:
        raise Stop(f"{intent.target} refused the delivery: HTTP {status}")
    if status in SNOOZE_STATUSES and asked is not None:
        try:
            after = retry_after(asked, timezone.now())
        except ValueError as error:
            raise DeliveryFailed(
                f"{intent.target} answered HTTP {status} with an unusable "
                f"Retry-After {asked!r} ({error}): retried after the usual backoff"
            ) from error
        raise Retry(
            after=after,
            reason=f"partner answered {status} with Retry-After: {asked.strip()}",
        )
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
