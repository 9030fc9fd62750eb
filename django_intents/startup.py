"""How a pool starts: where its wake-ups come from, and the line that says so.

The start-up line is the one an operator reads first when a pool misbehaves,
so it names everything the pool was started with: database, kinds and their
handlers, workers, lease, wake-up sources, grace, drain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from django.db import connections

from .handlers import Handler, describe
from .wakeup import CommitWatcher, Listener, commit_watch_supported, listen_supported

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


def start_wakeups(
    *, using: str, kinds: list[str], wake: Callable[[], None]
) -> Listener | CommitWatcher | None:
    """Start what rings the alarm when intents arrive, if the database can tell."""
    connection = connections[using]
    if commit_watch_supported(connection):
        watcher = CommitWatcher(using=using, wake=wake)
        watcher.start()
        return watcher
    if not listen_supported(connection):
        if connection.vendor == "postgresql":
            log.warning("LISTEN/NOTIFY needs psycopg >= 3.2; polling only")
        return None
    listener = Listener(using=using, kinds=kinds, wake=wake)
    listener.start()
    return listener


def log_start(
    *,
    using: str,
    handlers: Mapping[str, Handler],
    workers: int,
    lease: float,
    renew: float,
    poll: float,
    grace: float,
    drain: bool,
    listening: bool,
) -> None:
    connection = connections[using]
    kinds = ", ".join(f"{kind} -> {describe(handlers[kind])}" for kind in sorted(handlers))
    wakeups = ""
    if listening:
        wakeups = "commit watch, " if connection.vendor == "sqlite" else "LISTEN/NOTIFY, "
    log.info(
        "starting %d worker(s) on %s database %r (alias %r); kinds: %s; lease %g s, "
        "renewed every %g s; wake-ups: %spolling every %g s; shutdown grace %g s%s",
        workers,
        connection.vendor,
        str(connection.settings_dict.get("NAME", "")),
        using,
        kinds,
        lease,
        renew,
        wakeups,
        poll,
        grace,
        "; draining" if drain else "",
    )
