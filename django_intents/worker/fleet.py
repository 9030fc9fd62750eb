"""One process serving several databases: a pool per database (issue 41).

Each database gets a whole ``WorkerPool`` of its own, in a thread of its own:
its own loop, worker threads and connections, so SPEC §9's bound on a pool's
connections holds per database, and a database with a deep backlog (or one
that is slow to answer) never takes a turn from another: fairness by
construction, not by a scheduler. The pools share the process and nothing
else.

The main thread only waits and takes the signals (a pool in another thread
cannot): the first SIGTERM or SIGINT stops every pool with its grace
period, a second ends the grace periods, as for one pool (``shutdown.py``).

A pool that ends on its own ends the process's work the same way for all:
after a drain each pool ends when its database has nothing due, and the
process when the last one does; after an outage (``DB_ERROR_TIMEOUT`` of
failing round trips on its database) the others are stopped too and the
process exits non-zero, as one pool does, for its supervisor to restart.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

from django_intents.worker import log
from django_intents.worker.pool import WorkerPool

# Seconds the main thread sleeps between looks at the pools: signals wait no longer.
LOOK = 0.2


class Fleet:
    """Run ``pools`` (alias -> pool, each built with ``handle_signals=False``) until all end."""

    def __init__(self, pools: Mapping[str, WorkerPool], *, drain: bool) -> None:
        self.pools = dict(pools)
        self._drain = drain
        self._statuses: dict[str, int] = {}
        self._signals = 0

    def run(self) -> int:
        """Run every pool; the highest of their exit statuses."""
        threads = {
            alias: threading.Thread(
                target=self._run_one, args=(alias, pool), name=f"intents-pool-{alias}"
            )
            for alias, pool in self.pools.items()
        }
        previous = self._handle_signals()
        try:
            for thread in threads.values():
                thread.start()
            stopping = False
            while any(thread.is_alive() for thread in threads.values()):
                for thread in threads.values():
                    thread.join(LOOK / len(threads))
                failed = sorted(alias for alias, status in self._statuses.items() if status)
                if failed and not stopping:
                    stopping = True
                    log.error(
                        "database %s: its pool ended with status %d; stopping the pools "
                        "of the other databases",
                        ", ".join(failed),
                        max(self._statuses.values()),
                    )
                    self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return max(self._statuses.values(), default=0)

    def stop(self, *, grace: float | None = None) -> None:
        """Stop every pool (any thread, or a signal handler)."""
        for pool in self.pools.values():
            pool.stop(grace=grace)

    def healthy(self) -> bool:
        """True while every pool is: one database out is a process to look at."""
        return all(pool.healthy() for pool in self.pools.values())

    def _run_one(self, alias: str, pool: WorkerPool) -> None:
        try:
            self._statuses[alias] = pool.run()
        except Exception:
            log.exception("database %s: the pool failed", alias)
            self._statuses[alias] = 1

    def _handle_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First signal: every pool stops with its grace period. Second: now."""
        self._signals += 1
        self.stop(grace=0.0 if self._signals > 1 else None)
