"""The partners of ``bench/partners.py``: four behaviours, on one local server with two ports.

    python -m bench.partner_server --port 8770 --down-port 8771 --down-for 30

On ``--port``, ``POST /<behaviour>/<n>?id=<key>&at=<enqueue epoch>`` is
target ``n`` of a partner that behaves as ``behaviour`` says:

- ``healthy``: 200 after 50 ms;
- ``limited``: allows 20 requests per second per target (the sliding window
  of ``bench/relay_server.py``); above that 429 at once with
  ``Retry-After: 1``, counted;
- ``ordered``: 200 after 50 ms, and checks that each target's intents
  arrive in the order ``POST /expect`` gave (``{"/ordered/0": [key, ...]}``,
  the order the queue promises, ``created_at, id``): a request for an intent
  while an earlier one of its target has not been delivered is counted out
  of order. The first request for every tenth intent (the 10th, 20th, ...)
  answers 500: a failing head its target must wait for.

On ``--down-port``, ``POST /down/<n>`` is the partner that is down, then up:
for ``--down-for`` seconds after ``POST /start`` it accepts each connection,
reads the request line and resets the connection (the client sees a
connection error, as for a refused one, and the server counts the attempt
against its target, which a refusal would not let it do); then it answers
like a healthy one, and records its first delivery after the return.
``POST /start`` is sent by the benchmark when its worker starts; ``POST /up``
ends the outage at once (after ``POST /start``), for a benchmark that must
wait for something before the partner returns.

``GET /stats`` returns, per target path, the counts of
``relay_server.Target`` (requests, 429s, deliveries, last delivery, ...)
with the out-of-order and injected-failure counts, and the outage's times.
Like ``bench/relay_server.py`` it runs as a process of its own, so its CPU is
not charged to the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import struct
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bench.relay_server import DELAY, Target

BEHAVIOURS = ("healthy", "limited", "ordered", "down")
FAIL_EVERY = 10  # the ordered partner fails the first request of every tenth intent


@dataclass
class Partner(Target):
    """A target's counts, plus what the ordered and the down partners check."""

    failed: int = 0  # injected 500s (ordered)
    out_of_order: int = 0
    order: dict[str, int] = field(default_factory=dict)  # key -> rank among its target's
    next_rank: int = 0  # the lowest rank not yet delivered
    ranks_done: set[int] = field(default_factory=set)
    failed_once: set[str] = field(default_factory=set)
    first_after_up: float | None = None

    def arrives(self, key: str) -> bool:
        """Check an ordered request's place; ``False`` when it is the one failure it gets."""
        rank = self.order.get(key)
        if rank is None:
            return True
        if rank > self.next_rank:
            self.out_of_order += 1
        if rank % FAIL_EVERY == FAIL_EVERY - 1 and key not in self.failed_once:
            self.failed_once.add(key)
            self.failed += 1
            return False
        return True

    def delivered_rank(self, key: str) -> None:
        rank = self.order.get(key)
        if rank is None:
            return
        self.ranks_done.add(rank)
        while self.next_rank in self.ranks_done:
            self.next_rank += 1

    def counts(self) -> dict[str, Any]:
        return {
            **super().counts(),
            "failed": self.failed,
            "out_of_order": self.out_of_order,
            "first_after_up": self.first_after_up,
        }


@dataclass
class Outage:
    """The down partner's clock: down from ``POST /start`` for ``seconds``, then up."""

    seconds: float
    started: float | None = None
    up_at: float | None = None
    # per target path: requests whose connection was reset while down
    attempts_down: dict[str, int] = field(default_factory=dict)


def make_app(outage: Outage) -> web.Application:
    """The partner routes and the control routes, over one table of targets."""
    partners: dict[str, Partner] = {}
    started: list[float] = []

    def partner(behaviour: str, n: str) -> Partner:
        if behaviour not in BEHAVIOURS or not n.isdigit():
            raise web.HTTPNotFound()
        path = f"/{behaviour}/{n}"
        if path not in partners:
            partners[path] = Partner(behaviour)
        return partners[path]

    async def deliver(request: web.Request) -> web.Response:
        target = partner(request.match_info["behaviour"], request.match_info["n"])
        now = time.time()
        if not started:
            started.append(now)
        key = request.query.get("id", "")
        target.requests += 1
        target.in_flight += 1
        target.peak = max(target.peak, target.in_flight)
        try:
            if target.behaviour == "limited" and not target.admit(now):
                return web.Response(status=429, headers={"Retry-After": "1"})
            if target.behaviour == "ordered" and not target.arrives(key):
                return web.Response(status=500, text="failed once, on purpose")
            await asyncio.sleep(DELAY)
            done = time.time()
            target.record(key, request.query.get("at"), done)
            target.delivered_rank(key)
            if target.behaviour == "down" and target.first_after_up is None:
                target.first_after_up = done
            return web.Response(text="ok")
        finally:
            target.in_flight -= 1
            target.busy += time.time() - now

    async def expect(request: web.Request) -> web.Response:
        for path, keys in (await request.json()).items():
            _, behaviour, n = path.split("/")
            partner(behaviour, n).order = {key: rank for rank, key in enumerate(keys)}
        return web.json_response({"ok": True})

    async def start(request: web.Request) -> web.Response:
        if outage.started is None:
            outage.started = time.time()
            request.app["up"].set()
        return web.json_response({"started": outage.started})

    async def up(request: web.Request) -> web.Response:
        request.app["up_now"].set()
        return web.json_response({"ok": True})

    async def stats(request: web.Request) -> web.Response:
        body: dict[str, Any] = {
            "started": started[0] if started else None,
            "outage": {
                "seconds": outage.seconds,
                "started": outage.started,
                "up_at": outage.up_at,
                "attempts_down": outage.attempts_down,
            },
            "targets": {path: t.counts() for path, t in sorted(partners.items())},
        }
        if request.query.get("latencies"):
            body["latencies"] = {path: list(t.delivered.values()) for path, t in partners.items()}
        return web.json_response(body)

    app = web.Application()
    app["up"] = asyncio.Event()  # set by /start: the outage's clock runs from then
    app["up_now"] = asyncio.Event()  # set by /up: the outage ends now
    app.router.add_post("/{behaviour}/{n}", deliver)
    app.router.add_post("/expect", expect)
    app.router.add_post("/start", start)
    app.router.add_post("/up", up)
    app.router.add_get("/stats", stats)
    return app


async def _refuse(outage: Outage, port: int) -> asyncio.Server:
    """A listener that resets every connection at once, counting each."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:  # the request line, to count the attempt against its target
            line = await asyncio.wait_for(reader.readline(), 2.0)
        except (TimeoutError, ConnectionError):
            line = b""
        parts = line.decode("latin-1").split()
        path = parts[1].partition("?")[0] if len(parts) > 1 else "?"
        outage.attempts_down[path] = outage.attempts_down.get(path, 0) + 1
        sock = writer.get_extra_info("socket")
        if sock is not None:  # SO_LINGER 0: close with a reset, not a polite FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    return await asyncio.start_server(reset, "127.0.0.1", port, reuse_address=True, backlog=4096)


async def serve(port: int, down_port: int, down_for: float) -> None:
    """Serve until SIGTERM or SIGINT; print ``ready`` once both sockets listen."""
    outage = Outage(down_for)
    app = make_app(outage)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=300)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_address=True)
    await site.start()
    refusing = await _refuse(outage, down_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)

    async def come_back() -> None:
        await app["up"].wait()
        with suppress(TimeoutError):
            await asyncio.wait_for(app["up_now"].wait(), down_for)
        refusing.close()
        await refusing.wait_closed()
        back = web.TCPSite(runner, "127.0.0.1", down_port, backlog=4096, reuse_address=True)
        await back.start()
        outage.up_at = time.time()

    returning = asyncio.create_task(come_back())
    await stop.wait()
    returning.cancel()
    refusing.close()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--down-port", type=int, required=True)
    parser.add_argument(
        "--down-for", type=float, default=30.0, help="seconds the down partner stays down"
    )
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.down_port, args.down_for))


if __name__ == "__main__":
    main()
