"""How a pool announces itself: the start-up line.

The start-up line is the one an operator reads first when a pool misbehaves,
so it names everything the pool was started with: database, kinds and their
handlers, workers, lease, wake-up sources, grace, drain. A warning follows when
intents are due of kinds that no handler in this project runs: no pool will
ever take them, and the operator reading this line is the one who can act.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db import DatabaseError, connections

from django_intents.handlers import Handler, describe, known_kinds
from django_intents.models import Intent
from django_intents.rules import states
from django_intents.store import backend_for
from django_intents.store.clock import server_now
from django_intents.worker import log
from django_intents.worker.execution import is_async
from django_intents.worker.wakeup import Waker


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
        backend_for(connection, Intent).vendor,
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
    """Warn about due intents of kinds nothing in this project runs."""
    try:
        orphans = unhandled_due(using)
    except DatabaseError:
        return  # the loop meets the outage and reports it; this is only a hint
    if orphans:
        log.warning(
            "intents are due of kind(s) that no handler in this project runs: %s; no pool "
            "will take them. Register a handler, list the kind in INTENTS['EXTERNAL_KINDS'] "
            "if another service runs it, or cancel the intents",
            ", ".join(f"{kind} ({n} due)" for kind, n in orphans.items()),
        )


def unhandled_due(using: str) -> dict[str, int]:
    """Due intents per kind that nothing here runs, by kind.

    The kinds in the table come one at a time, each the first entry of the
    kind index after the last (a probe, however many rows a kind has); only
    a kind no handler knows has its due intents counted.
    """
    known = known_kinds()
    rows = Intent.objects.using(using)
    due = states.due(server_now(using))
    found: dict[str, int] = {}
    kind: str | None = None
    while True:
        after = rows if kind is None else rows.filter(kind__gt=kind)
        kind = after.order_by("kind").values_list("kind", flat=True).first()
        if kind is None:
            return found
        if kind not in known:
            n = rows.filter(due, kind=kind).order_by().count()
            if n:
                found[kind] = n
