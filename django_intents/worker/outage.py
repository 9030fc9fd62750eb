"""Riding out a database outage: reconnect, back off, and know when to give up.

A restart, a failover or a dropped connection should cost a pool a few log
lines, not its claims; a database that stays away should end the process, so
that a supervisor notices. The loop and the worker threads (recording a
result) face the same outage and treat it the same way, so the rule lives
here once: each error closes the connection (Django reopens it on the next
query), waits a jittered, doubling delay from 0.1 s up to 5 s, and gives up
once errors have lasted ``INTENTS["DB_ERROR_TIMEOUT"]`` seconds.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable

from django.db import Error as DatabaseFailure
from django.db import connections

from django_intents.rules.validation import exception_text
from django_intents.worker import log

# Executions of one statement before psycopg prepares it (its own default is 5).
PREPARE_AFTER = 2
FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class Outage:
    """The database errors one thread has met in a row, and its next wait.

    ``then`` says what giving up means for the caller ("exiting"); ``about``
    prefixes every line, so a worker thread names the intent it was recording.
    """

    def __init__(
        self,
        *,
        using: str,
        timeout: float,
        then: str,
        about: str = "",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._using = using
        self._timeout = timeout
        self._then = then
        self._prefix = f"{about}: " if about else ""
        self._sleep = sleep
        self._since: float | None = None
        self._delay = FIRST_DELAY

    def failed(self, exc: Exception) -> bool:
        """Log ``exc``, reconnect and wait; return True once the outage lasted too long."""
        now = time.monotonic()
        if self._since is None:
            self._since, self._delay = now, FIRST_DELAY
        with contextlib.suppress(DatabaseFailure):
            connections[self._using].close()
        elapsed = now - self._since
        if elapsed >= self._timeout:
            log.error(
                "%sdatabase unavailable for %.1f s (limit %.1f s), %s: %s",
                self._prefix,
                elapsed,
                self._timeout,
                self._then,
                cause_text(exc),
            )
            return True
        # The last wait ends at the limit, so the final try comes before giving up.
        delay = min(self._delay, max(self._timeout - elapsed, 0.05))
        log.warning(
            "%sdatabase error, reconnecting in %.1f s: %s", self._prefix, delay, cause_text(exc)
        )
        self._sleep(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        self._delay = min(self._delay * 2, MAX_DELAY)
        return False

    @property
    def timeout(self) -> float:
        return self._timeout

    def over(self) -> None:
        """Note a round trip that worked: the next error starts a new outage."""
        if self._since is not None:
            elapsed = time.monotonic() - self._since
            log.info("%sdatabase reachable again after %.1f s", self._prefix, elapsed)
            self._since = None


def reuse_connection(using: str, *, prepare: bool = False) -> None:
    """Keep the pool's connection from turn to turn; close it only when it is broken.

    Django's ``close_old_connections()`` also closes a connection older than
    ``CONN_MAX_AGE``, which is a request's setting: with the default 0 a pool
    would open a new connection (a new server process, on PostgreSQL) every
    turn. The pool's connection is opened once and reopened only after an
    error (SPEC §9), like a request's connection with ``CONN_HEALTH_CHECKS``.

    ``prepare`` (the pool's LISTEN proved the alias direct, ``Waker.direct``):
    psycopg prepares the statements this connection repeats. Parsing and
    planning were half of an idle pool's claim; Django prepares nothing
    unless ``OPTIONS["prepare_threshold"]`` says so, for the sake of poolers
    in transaction mode, and only this connection is known to have none.
    """
    connection = connections[using]
    if connection.connection is None:
        return
    if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
        connection.close()  # a transaction left open: never carry it into the next turn
    elif connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()
    elif prepare and getattr(connection.connection, "prepare_threshold", 0) is None:
        connection.connection.prepare_threshold = PREPARE_AFTER  # psycopg 3's connection
        log.info("preparing the statements the pool repeats on %r (LISTEN proved it direct)", using)


def cause_text(exc: BaseException) -> str:
    """An exception as the pool logs it: ``Type: message`` on one line."""
    return one_line(exception_text(exc))


def one_line(text: str | None) -> str:
    return " ".join((text or "").split())
