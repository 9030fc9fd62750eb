"""The partners the relay workload delivers to: twenty targets on one local server.

    python -m bench.relay_server --port 8766 [--dead 0] [--limited 1]

``GET /t/<n>?id=<key>&at=<enqueue epoch>`` is target ``n`` (0–19). A healthy
target answers 200 after 50 ms. The ``--dead`` one never answers: it holds
the request until the client gives up and closes the connection. The
``--limited`` one allows 20 requests per second (a sliding one-second window
of the requests it let through): above that it answers 429 at once with
``Retry-After: 1``, else 200 after 50 ms, like a healthy one.

The server measures what must be the same for every queue, so it counts here
and not in the workers: per target, the requests, the 429s (the requests
above the limit), the peak of requests in flight at once (for the dead target,
the most workers it held), the seconds its requests were in flight, summed
(over a run's time, the requests it had in flight on average: what the
worker kept busy), and for each delivery (a 200) the delay from the
``at`` the handler passed, its intent's enqueue time, to the moment the 200
was sent. ``GET /stats`` returns the counts, and the delays with
``?latencies=1``. It runs as a process of its own, like ``bench/http_server.py``,
so its CPU is not charged to the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TARGETS = 20
DELAY = 0.05
LIMIT = 20  # requests per second the rate-limited target lets through
HANG = 120.0  # the dead target's longest hold; every client here gives up long before


@dataclass
class Target:
    """What one target saw; ``delivered`` maps each key to its enqueue-to-200 seconds."""

    behaviour: str  # "healthy", "dead" or "limited"
    requests: int = 0
    too_many: int = 0
    in_flight: int = 0
    peak: int = 0
    let_through: collections.deque[float] = field(default_factory=collections.deque)
    delivered: dict[str, float] = field(default_factory=dict)
    last: float | None = None
    busy: float = 0.0  # seconds of requests in flight, summed: its mean concurrency over time

    def admit(self, now: float, limit: int = LIMIT) -> bool:
        """Whether a request at ``now`` fits the one-second sliding window; counts a 429."""
        window = self.let_through
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= limit:
            self.too_many += 1
            return False
        window.append(now)
        return True

    def record(self, key: str, at: str | None, done: float) -> None:
        """A 200 sent at ``done`` for ``key``: its first one keeps its enqueue-to-200 delay."""
        if key not in self.delivered:
            self.delivered[key] = done - float(at or done)
        self.last = done

    def counts(self) -> dict[str, Any]:
        return {
            "behaviour": self.behaviour,
            "requests": self.requests,
            "too_many": self.too_many,
            "peak": self.peak,
            "in_flight": self.in_flight,
            "delivered": len(self.delivered),
            "last": self.last,
            "busy": self.busy,
        }


def make_app(dead: int, limited: int) -> web.Application:
    """The target route and the stats route, over one table of targets."""
    targets = [
        Target("dead" if n == dead else "limited" if n == limited else "healthy")
        for n in range(TARGETS)
    ]
    started: list[float] = []

    async def deliver(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if not 0 <= n < TARGETS:
            raise web.HTTPNotFound()
        target = targets[n]
        now = time.time()
        if not started:
            started.append(now)
        target.requests += 1
        target.in_flight += 1
        target.peak = max(target.peak, target.in_flight)
        try:
            if target.behaviour == "dead":
                # Cancelled when the client closes the connection
                # (handler_cancellation below): the hold ends with the client's timeout.
                await asyncio.sleep(HANG)
                return web.Response(status=504)
            if target.behaviour == "limited" and not target.admit(now):
                return web.Response(status=429, headers={"Retry-After": "1"})
            await asyncio.sleep(DELAY)
            target.record(request.query.get("id", ""), request.query.get("at"), time.time())
            return web.Response(text="ok")
        finally:
            target.in_flight -= 1
            target.busy += time.time() - now

    async def stats(request: web.Request) -> web.Response:
        body: dict[str, Any] = {
            "started": started[0] if started else None,
            "targets": [t.counts() for t in targets],
        }
        if request.query.get("latencies"):
            body["latencies"] = [list(t.delivered.values()) for t in targets]
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/t/{n}", deliver)
    app.router.add_get("/stats", stats)
    return app


async def serve(port: int, dead: int, limited: int) -> None:
    """Serve until SIGTERM or SIGINT; print ``ready`` once the socket listens."""
    runner = web.AppRunner(
        make_app(dead, limited), access_log=None, keepalive_timeout=300, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dead", type=int, default=-1, help="the target that hangs (-1: none)")
    parser.add_argument(
        "--limited", type=int, default=-1, help="the target limited to 20/s (-1: none)"
    )
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.dead, args.limited))


if __name__ == "__main__":
    main()
