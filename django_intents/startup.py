"""How a pool announces itself: the start-up line.

The start-up line is the one an operator reads first when a pool misbehaves,
so it names everything the pool was started with: database, kinds and their
handlers, workers, lease, wake-up sources, grace, drain.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from django.db import connections

from .handlers import Handler, describe
from .wakeup import Waker

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


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
    waker: Waker | None,
) -> None:
    connection = connections[using]
    kinds = ", ".join(f"{kind} -> {describe(handlers[kind])}" for kind in sorted(handlers))
    wakeups = f"{waker.label}, " if waker is not None else ""
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
