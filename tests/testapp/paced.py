"""Handlers of the rate tests (tests/test_rates_process.py): each notes when it started.

Not in ``handlers.py``, as ``quiet.py`` explains: the async one would turn
every pool the other tests start into a mixed pool. Each leaves an ``Effect``
whose note is the claim's time (``updated_at``, the start the rate counts, on
the database's clock) and the handler's own start (this host's wall clock),
in seconds since the epoch.
"""

from __future__ import annotations

import asyncio
import time

from asgiref.sync import sync_to_async

from django_intents import Attempt
from django_intents.models import Intent

from .models import Effect


def stamp(intent: Intent) -> None:
    note = f"{intent.updated_at.timestamp():.6f} {time.time():.6f}"
    Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token, note=note)


def paced(intent: Intent, attempt: Attempt) -> None:
    stamp(intent)
    time.sleep(0.02)


async def async_paced(intent: Intent, attempt: Attempt) -> None:
    await sync_to_async(stamp)(intent)
    await asyncio.sleep(0.02)


# kind -> dotted path, for the worker's INTENTS["HANDLERS"]
HANDLERS = {f"test.{name}": f"tests.testapp.paced.{name}" for name in ("paced", "async_paced")}
