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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

# aiohttp (aio-libs): the fastest well-maintained asyncio HTTP client, with a
# connection pool per session and a timeout per request (ClientTimeout).
import aiohttp

from django_intents import Stop, handler

from .models import PushLog

if TYPE_CHECKING:
    from django_intents import Attempt
    from django_intents.models import Intent

# The whole request (connect, send, read the answer) must finish in this many
# seconds. Well below the lease (INTENTS["LEASE"], 30 s by default), so a hung
# partner costs one attempt, not the claim.
TIMEOUT = 5.0
USER_AGENT = "django-intents-example/1"


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


@handler("webhook")
async def deliver_webhook(intent: Intent, attempt: Attempt) -> None:
    """POST the payload as JSON to ``intent.target``; 2xx is done, 4xx (but 429) is final."""
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
    except TimeoutError as error:
        raise DeliveryFailed(f"{intent.target} did not answer within {TIMEOUT:g} s") from error
    # Other network errors (refused, reset) propagate as they are: retry.
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
