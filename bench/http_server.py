"""The partner the io workload calls: answers every request after a fixed delay.

    python -m bench.http_server --port 8765 --delay 0.1

``GET /ok`` answers 200 and ``GET /fail`` answers 503, each after ``--delay``
seconds: the shape of a slow partner that is up, and of one that is down but
still takes its time to say so. It runs as a process of its own, started by
the benchmark, so that its CPU is not charged to the workers being measured;
one event loop holds thousands of idle connections, which is what a pool with
1,000 attempts in flight opens against it. Access logging is off: writing a
line per request would cost more than answering it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from aiohttp import web


def make_app(delay: float) -> web.Application:
    """The two routes, both waiting ``delay`` seconds before they answer."""

    async def ok(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(text="ok")

    async def fail(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(status=503, text="partner down")

    app = web.Application()
    app.router.add_get("/ok", ok)
    app.router.add_get("/fail", fail)
    return app


async def serve(port: int, delay: float) -> None:
    """Serve until SIGTERM or SIGINT; print ``ready`` once the socket listens."""
    runner = web.AppRunner(make_app(delay), access_log=None, keepalive_timeout=300)
    await runner.setup()
    # A deep backlog: a pool that starts 1,000 attempts at once connects all at once.
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
    parser.add_argument("--delay", type=float, default=0.1)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.delay))


if __name__ == "__main__":
    main()
