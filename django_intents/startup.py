"""How a pool announces itself: the start-up line.

The start-up line is the one an operator reads first when a pool misbehaves,
so it names everything the pool was started with: database, kinds and their
handlers, workers, lease, wake-up sources, grace, drain. A warning follows when
intents are due of kinds that no handler in this project runs: no pool will
ever take them, and the operator reading this line is the one who can act.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from django.db import DatabaseError, connections

from .backlog import read_backlog
from .execution import is_async
from .handlers import Handler, describe, unhandled
from .wakeup import Waker

# The pool's logger: operators filter on one name for everything a pool says.
log = logging.getLogger("django_intents.worker")


def log_start(
    *,
    using: str,
    handlers: Mapping[str, Handler],
    workers: int,
    concurrency: int,
    lease: float,
    renew: float,
    poll: float,
    grace: float,
    drain: str,
    waker: Waker | None,
) -> None:
    connection = connections[using]
    kinds = ", ".join(
        f"{kind} -> {'async ' if is_async(handlers[kind]) else ''}{describe(handlers[kind])}"
        for kind in sorted(handlers)
    )
    sizes = []
    if not all(is_async(h) for h in handlers.values()):
        sizes.append(f"{workers} worker thread(s)")
    if any(is_async(h) for h in handlers.values()):
        sizes.append(f"up to {concurrency} async handler(s) at once")
    wakeups = f"{waker.label}, " if waker is not None else ""
    log.info(
        "starting %s on %s database %r (alias %r); kinds: %s; lease %g s, "
        "renewed every %g s; wake-ups: %spolling every %g s; shutdown grace %g s%s",
        " and ".join(sizes),
        connection.vendor,
        str(connection.settings_dict.get("NAME", "")),
        using,
        kinds,
        lease,
        renew,
        wakeups,
        poll,
        grace,
        f"; {drain}" if drain else "",
    )
    warn_unhandled(using)


def warn_unhandled(using: str) -> None:
    """Warn about due intents of kinds nothing in this project runs (one grouped query)."""
    try:
        backlog = read_backlog(using=using)
    except DatabaseError:
        return  # the loop meets the outage and reports it; this is only a hint
    orphans = unhandled({kind.kind: kind.due for kind in backlog.kinds})
    if orphans:
        log.warning(
            "intents are due of kind(s) that no handler in this project runs: %s; no pool "
            "will take them. Register a handler, list the kind in INTENTS['EXTERNAL_KINDS'] "
            "if another service runs it, or cancel the intents",
            ", ".join(f"{kind} ({n} due)" for kind, n in orphans.items()),
        )
