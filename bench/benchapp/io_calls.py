"""What every io job does, for every system: wait 100 ms on a timer or on a real HTTP call.

The handlers and tasks of each system call these, so the only difference
between systems is the queue. ``BENCH_IO_DELAY`` is the wait, ``BENCH_IO_URL``
the local partner (``bench/http_server.py``), ``BENCH_IO_POOL`` how many HTTP
connections one worker process may keep (its threads or its attempts in
flight): a pool smaller than that would make threads queue for a connection
inside the client, and the benchmark would measure the client instead of the
queue.

A failing job waits the same time, then raises: a partner that is down still
costs the handler its timeout, and the queue must record the failure as
cheaply as the success.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from contextlib import suppress
from typing import Any

from . import probe

DELAY = float(os.environ.get("BENCH_IO_DELAY", "0.1"))
URL = os.environ.get("BENCH_IO_URL", "http://127.0.0.1:8765")
POOL = int(os.environ.get("BENCH_IO_POOL", "1024"))
TIMEOUT = 10.0


class PartnerDown(Exception):
    """The call failed: what a handler raises when its partner is down."""


def _sync_pool() -> Any:
    import urllib3

    # One pool per process, sized for every worker thread, no retries: a
    # failed call is the handler's to report, not the client's to repeat.
    return urllib3.PoolManager(
        maxsize=POOL, block=True, retries=False, timeout=urllib3.Timeout(total=TIMEOUT)
    )


_pool: Any = None
_sessions: dict[asyncio.AbstractEventLoop, Any] = {}


def sync_call(mode: str, fail: bool) -> None:
    """Block for ``DELAY``: ``time.sleep``, or a GET that the partner answers that late."""
    global _pool
    probe.noop()
    if mode == "sleep":
        time.sleep(DELAY)
        if fail:
            raise PartnerDown("partner down (simulated)")
        return
    if _pool is None:
        _pool = _sync_pool()
    response = _pool.request("GET", f"{URL}/{'fail' if fail else 'ok'}")
    if response.status != 200:
        raise PartnerDown(f"partner answered HTTP {response.status}")


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
    """Close the sessions on their loop if it is still usable.

    Otherwise aiohttp's ``Unclosed client session`` warning prints every
    pooled connection into the worker log at exit.
    """
    for loop, session in _sessions.items():
        with suppress(Exception):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(session.close())
            else:
                session.connector._close()  # loop gone: drop the sockets quietly


async def async_call(mode: str, fail: bool) -> None:
    """Await ``DELAY``: ``asyncio.sleep``, or a GET through the shared session."""
    probe.noop()
    if mode == "sleep":
        await asyncio.sleep(DELAY)
        if fail:
            raise PartnerDown("partner down (simulated)")
        return
    session = await _session()
    async with session.get(f"{URL}/{'fail' if fail else 'ok'}") as response:
        await response.read()
        if response.status != 200:
            raise PartnerDown(f"partner answered HTTP {response.status}")
