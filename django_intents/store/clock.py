"""The queue's clock: the database server's time, read now and then and
carried forward on this process's monotonic clock.

Leases and due times are compared across hosts. Judged by each host's own
wall clock, a host running ahead would take over live leases and one running
behind would keep expired ones, so every time the manager writes or compares
when the caller gives no ``now=`` comes from here (SPEC §12).

Asking the server on every call would add a round trip to every statement, and
putting ``now()`` into the SQL would take ``now=`` away from tests and tools.
Instead one reading per database alias is kept with the monotonic time it was
taken at, and the time now is that reading plus the monotonic time since. The
host's wall clock is never consulted: it may be stepped by NTP, set by hand or
faked, and nothing here moves. The monotonic clock's rate error (parts per
million) is bounded by reading the server again every ``REFRESH`` seconds.

The reading is stamped when its round trip returns, so this clock lags the
server by at most that round trip: a lease is judged expired that much late,
never early. A reading whose round trip took more than ``ROUND_TRIP`` is
taken again (``refresh``).

SQLite has no server; its clock is the C library's wall clock in the calling
process, so that clock is read on every call (``wall_clock``), not carried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connections, router

from django_intents.rules.validation import aware
from django_intents.store import read_clock

REFRESH = 60.0
# A reading whose round trip took longer is taken again (``refresh``).
ROUND_TRIP = 0.05
TRIES = 5


@dataclass(frozen=True)
class Reading:
    server: datetime | None  # None: the database reads this process's wall clock
    monotonic: float


_readings: dict[str, Reading] = {}


def now_or(now: Any, alias: str | None = None) -> datetime:
    """``now``, checked; when it is ``None``, the time now by ``alias``'s server."""
    return server_now(alias) if now is None else aware("now", now)


def server_now(alias: str | None = None, *, read: bool = True) -> datetime:
    """The database server's time now, aware, in UTC.

    ``read=False`` never queries once there is a reading, however old: for
    threads that must not open a connection of their own (a pool's event loop,
    its recorder), whose pool reads the clock on its loop's connection.
    """
    alias = alias or router.db_for_write(apps.get_model("django_intents", "Intent"))
    reading = _readings.get(alias)
    if reading is None or (read and time.monotonic() - reading.monotonic > REFRESH):
        reading = refresh(alias)
    if reading.server is None:
        return wall_clock()
    return reading.server + timedelta(seconds=time.monotonic() - reading.monotonic)


def wall_clock() -> datetime:
    """This host's wall clock, as the C library gives it to SQLite."""
    return datetime.fromtimestamp(time.clock_gettime(time.CLOCK_REALTIME), UTC)


def refresh(alias: str) -> Reading:
    """Read the server's clock on this thread's connection to ``alias``.

    A reading is only as good as its round trip: a thread held up between the
    server's answer and its own stamp (a busy interpreter, a slow network)
    would carry a clock that lags by that long for a whole ``REFRESH``. So the
    read is timed and taken again while its round trip is over ``ROUND_TRIP``,
    up to ``TRIES`` times, and the quickest one is kept, as NTP does. It is
    stamped when it returns, so the clock lags the server's, never leads it.
    """
    best, took = _timed_read(alias)
    for _ in range(TRIES - 1):
        if best.server is None or took <= ROUND_TRIP:
            break
        again, again_took = _timed_read(alias)
        if again_took < took:
            best, took = again, again_took
    _readings[alias] = best
    return best


def _timed_read(alias: str) -> tuple[Reading, float]:
    sent = time.monotonic()
    server = read_clock(connections[alias])  # None on SQLite: nothing to carry
    back = time.monotonic()
    return Reading(server, back), back - sent


def forget() -> None:
    """Drop every reading (tests that point an alias at another server)."""
    _readings.clear()
