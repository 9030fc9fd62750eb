"""Handlers of the connection-count tests (tests/test_worker_connections.py).

Thousands of attempts, none of which touches the ORM, so every connection the
worker opens is the pool's own; each waits a little, as a call to a partner
would. They are not in ``handlers.py`` on purpose: registered there, the two
async ones would turn every pool the other tests start into a mixed sync and
async pool. The tests name them in the worker's ``INTENTS["HANDLERS"]`` and
declare their kinds with ``external_kinds`` for enqueue.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django_intents import Attempt
from django_intents.models import Intent


def options(intent: Intent) -> dict[str, Any]:
    return intent.payload if isinstance(intent.payload, dict) else {}


def quiet(intent: Intent, attempt: Attempt) -> None:
    time.sleep(options(intent).get("seconds", 0.005))


def quiet_fail(intent: Intent, attempt: Attempt) -> None:
    time.sleep(options(intent).get("seconds", 0.005))
    raise ValueError(f"partner down {options(intent).get('n')}")


async def async_quiet(intent: Intent, attempt: Attempt) -> None:
    await asyncio.sleep(options(intent).get("seconds", 0.05))


async def async_quiet_fail(intent: Intent, attempt: Attempt) -> None:
    await asyncio.sleep(options(intent).get("seconds", 0.05))
    raise ValueError(f"partner down {options(intent).get('n')}")


# kind -> dotted path, for the worker's INTENTS["HANDLERS"]
HANDLERS = {
    f"test.{name}": f"tests.testapp.quiet.{name}"
    for name in ("quiet", "quiet_fail", "async_quiet", "async_quiet_fail")
}
