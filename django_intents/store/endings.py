"""How a pool ends a claim other than by completing it: a row of ``finish_many``.

Each backend applies a batch of them with its own statement (``finish_many``
in its SQL file), fenced by each claim's token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Ending:
    """How a pool ends one claim other than by completing it: a row of ``finish_many``.

    ``state`` is ``pending`` (a retry, or a release when ``next_at`` is now)
    or ``cancelled``; ``next_at``, ``error`` and ``traceback`` are left as they are
    when ``None``.
    ``snooze`` adds one to ``snoozes``: a ``Retry(after=...)``, whose claim
    ``MAX_ATTEMPTS`` then does not count. ``unstarted`` takes the claim's
    attempt back: a release of a claim that waited in a pool's queue and never
    reached a handler (a stall's give-back, a stop), which must not bring the
    intent closer to ``MAX_ATTEMPTS`` however often it happens.
    """

    id: str
    token: str
    state: str
    next_at: datetime | None = None
    error: str | None = None
    snooze: bool = False
    unstarted: bool = False
    traceback: str | None = None


Finished = tuple[str, str, str]  # id, kind, state: one row that finish_many moved
