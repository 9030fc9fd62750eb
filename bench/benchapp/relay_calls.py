"""What every relay job does, for every system: deliver one message to its target.

The handlers and tasks of each system call :func:`deliver` and translate
:class:`Snooze` into their own way of running a job again later, so the only
difference between systems is the queue. ``BENCH_RELAY_POOL`` is how many
attempts one worker process has in flight (the aiohttp connector gets as
many connections, so the client never queues).

A well-behaved client does not hammer a partner that said 429: the
``Retry-After`` it answered blocks that target *in this process* until the
time has passed, and every job for it that comes up meanwhile snoozes until
then without sending anything. A queue's per-target limit bounds how many
jobs of a target run at once, not how many start per second, so without
this block every snoozed job would wake at once and most of them would be
429s again.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from contextlib import suppress
from typing import Any

from . import probe

POOL = int(os.environ.get("BENCH_RELAY_POOL", "64"))
TIMEOUT = 2.0  # the dead partner costs each attempt this long

_sessions: dict[asyncio.AbstractEventLoop, Any] = {}
_blocked: dict[str, float] = {}  # target -> epoch when its Retry-After has passed


class PartnerDown(Exception):
    """The delivery failed (timeout or an error status): an ordinary, counted failure."""


class Snooze(Exception):
    """The partner asked to be called again later: run this job in ``after`` seconds."""

    def __init__(self, after: float, reason: str) -> None:
        super().__init__(reason)
        self.after, self.reason = after, reason


async def _session() -> Any:
    """One ``aiohttp.ClientSession`` per event loop, as aiohttp's documentation asks."""
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        )
        _sessions[loop] = session
    return session


@atexit.register
def _close_sessions() -> None:
    """Close the sessions quietly, as ``io_calls`` does, so the log stays readable."""
    for loop, session in _sessions.items():
        with suppress(Exception):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(session.close())
            else:
                session.connector._close()


def _retry_after(value: str | None) -> float:
    """``Retry-After`` in seconds; the partner here sends seconds, a missing one means 1."""
    try:
        return max(float(value or 1), 0.0)
    except ValueError:
        return 1.0


_pool: Any = None


def deliver_sync(target: str, key: str, at: float) -> None:
    """:func:`deliver` for a worker that runs one job per thread: urllib3, the same rules."""
    global _pool
    import urllib3

    probe.noop()
    now = time.time()
    until = _blocked.get(target, 0.0)
    if until > now:
        raise Snooze(until - now, f"{target} blocked by an earlier Retry-After")
    if _pool is None:
        _pool = urllib3.PoolManager(
            maxsize=POOL, block=True, retries=False, timeout=urllib3.Timeout(total=TIMEOUT)
        )
    try:
        response = _pool.request("GET", target, fields={"id": key, "at": repr(at)})
    except urllib3.exceptions.HTTPError as exc:
        raise PartnerDown(f"{target}: {type(exc).__name__}") from None
    if response.status == 429:
        header = response.headers.get("Retry-After")
        after = _retry_after(header)
        _blocked[target] = max(_blocked.get(target, 0.0), time.time() + after)
        raise Snooze(after, f"429 from {target}, Retry-After {header}")
    if response.status != 200:
        raise PartnerDown(f"{target} answered HTTP {response.status}")


async def deliver(target: str, key: str, at: float) -> None:
    """GET ``target``; return on 200, raise :class:`Snooze` on 429, else :class:`PartnerDown`.

    ``at`` is the job's enqueue time, passed on so that the partner measures
    enqueue-to-delivery itself, with one clock for every system.
    """
    import aiohttp

    probe.noop()
    now = time.time()
    until = _blocked.get(target, 0.0)
    if until > now:
        raise Snooze(until - now, f"{target} blocked by an earlier Retry-After")
    session = await _session()
    try:
        async with session.get(target, params={"id": key, "at": repr(at)}) as response:
            await response.read()
            status, header = response.status, response.headers.get("Retry-After")
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise PartnerDown(f"{target}: {type(exc).__name__}") from None
    if status == 429:
        after = _retry_after(header)
        _blocked[target] = max(_blocked.get(target, 0.0), time.time() + after)
        raise Snooze(after, f"429 from {target}, Retry-After {header}")
    if status != 200:
        raise PartnerDown(f"{target} answered HTTP {status}")
