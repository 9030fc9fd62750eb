"""How stale a replica is, for the pages and gauges that read one (issue 41).

``INTENTS["READ_DATABASE"]`` points the admin's counts and the metrics'
gauges at a replica, which answers without loading the primary but lags
behind it. What it reads is said with how far behind the replica is, as
the server knows it: PostgreSQL's time since the last change it replayed,
MariaDB's and MySQL's ``Seconds_Behind_Master``. A server that is not
replaying (a primary named by mistake, or a replica that stopped) says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_intents.store.base import Backend


@dataclass(frozen=True)
class Lag:
    """``replaying``: the server is a replica applying changes; ``seconds``: how far
    behind (``None``: it does not know)."""

    replaying: bool
    seconds: float | None = None


def replica_lag(backend: Backend) -> Lag:
    """How far ``backend``'s database is behind the primary it replicates."""
    table = backend.table
    with table.cursor() as cursor:
        table.execute(cursor, "replica_lag")
        names = [column[0].lower() for column in cursor.description or ()]
        row = cursor.fetchone()
    if row is None:  # MariaDB/MySQL: no replication configured
        return Lag(replaying=False)
    values = dict(zip(names, row, strict=False))
    if "seconds_behind_master" in values:
        seconds = values["seconds_behind_master"]
        return Lag(replaying=True, seconds=None if seconds is None else float(seconds))
    lag = values.get("lag")
    return Lag(replaying=lag is not None, seconds=None if lag is None else max(float(lag), 0.0))
