"""Handlers of the ordered-delivery process tests (tests/test_ordered_process.py).

Each notes its start and its end in ``Effect`` rows, whose ids say in which
order they happened across every process: a target's notes must alternate
start, end, in the order its intents were created. ``fail_attempts`` makes
the first attempts raise, as a partner's error would. Not in ``handlers.py``:
the async one would turn every pool the other tests start into a mixed one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgiref.sync import sync_to_async

from django_intents import Attempt
from django_intents.models import Intent

from .models import Effect


def options(intent: Intent) -> dict[str, Any]:
    return intent.payload if isinstance(intent.payload, dict) else {}


def note(intent: Intent, text: str) -> None:
    Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token, note=text)


def ended(intent: Intent) -> None:
    """Note the end of the attempt; raise if it is one of those told to fail."""
    if intent.attempts <= options(intent).get("fail_attempts", 0):
        note(intent, f"fail {intent.attempts}")
        raise ValueError(f"partner refused attempt {intent.attempts}")
    note(intent, f"done {intent.attempts}")


def deliver(intent: Intent, attempt: Attempt) -> None:
    note(intent, f"start {intent.attempts}")
    time.sleep(options(intent).get("seconds", 0.01))
    ended(intent)


async def adeliver(intent: Intent, attempt: Attempt) -> None:
    await sync_to_async(note)(intent, f"start {intent.attempts}")
    await asyncio.sleep(options(intent).get("seconds", 0.01))
    await sync_to_async(ended)(intent)


# kind -> dotted path, for the worker's INTENTS["HANDLERS"]
HANDLERS = {
    "test.ordered": "tests.testapp.ordered.deliver",
    "test.aordered": "tests.testapp.ordered.adeliver",
}
