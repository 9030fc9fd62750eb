"""How a pool ends a claim other than by completing it, and the portable batch that does it.

Kept apart from ``base.py`` (module length, ``tests/test_shape.py``); PostgreSQL
has its own one-statement form over arrays (``postgresql.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_intents.rules.states import State

if TYPE_CHECKING:
    from django_intents.store.base import Backend

RUNNING = State.RUNNING.value
# Every transition out of running clears the claim.
CLEAR_CLAIM = "claim_token = '', claim_until = NULL"
# What the administrative transitions set, for one intent (``base.py``) or many
# (``admin.py``): ``retry_now`` takes ``now`` twice, ``cancel`` once.
RETRY_NOW_SET = f"state = '{State.PENDING.value}', next_at = %s, {CLEAR_CLAIM}, updated_at = %s"
CANCEL_SET = f"state = '{State.CANCELLED.value}', {CLEAR_CLAIM}, updated_at = %s"


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


def finish_by_case(backend: Backend, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
    """Apply a batch of fenced retries, cancellations and releases; return what moved.

    The portable form, for SQLite and MariaDB. Ids must be distinct. The
    running rows among them are read (and locked, where ``lock_running``
    says how) and those whose token still matches are updated in one
    statement, all in one write transaction, so the pair is as fenced as a
    one-row transition.
    """
    by_id = {ending.id: ending for ending in endings}
    marks = ", ".join(["%s"] * len(by_id))
    with backend.write_transaction(), backend.cursor() as cursor:
        cursor.execute(
            f"SELECT id, kind, claim_token FROM {backend.table}{backend.by_id} "
            f"WHERE id IN ({marks}) AND state = '{RUNNING}'{backend.lock_running}",
            list(by_id),
        )
        held = [(id, kind) for id, kind, token in cursor.fetchall() if by_id[id].token == token]
        if not held:
            return []
        endings = [by_id[id] for id, _ in held]
        sets: list[str] = []
        params: list[Any] = []
        for column, values in (
            ("state", [(e.id, e.state) for e in endings]),
            ("next_at", [(e.id, backend.dt(e.next_at)) for e in endings if e.next_at]),
            ("last_error", [(e.id, e.error) for e in endings if e.error is not None]),
            ("last_traceback", [(e.id, e.traceback) for e in endings if e.traceback is not None]),
        ):
            if values:
                whens = " ".join(["WHEN %s THEN %s"] * len(values))
                sets.append(f"{column} = CASE id {whens} ELSE {column} END")
                params += [v for pair in values for v in pair]
        for column, ids, change in (
            ("snoozes", [e.id for e in endings if e.snooze], "+"),
            ("attempts", [e.id for e in endings if e.unstarted], "-"),
        ):
            if ids:
                marks = ", ".join(["%s"] * len(ids))
                sets.append(
                    f"{column} = {column} {change} CASE WHEN id IN ({marks}) THEN 1 ELSE 0 END"
                )
                params += ids
        statement = (
            f"UPDATE {backend.table}{backend.by_id} SET {', '.join(sets)}, {CLEAR_CLAIM}, "
            f"updated_at = %s "
            f"WHERE id IN ({', '.join(['%s'] * len(held))})"
        )
        cursor.execute(statement, [*params, backend.dt(now), *(id for id, _ in held)])
    return [(id, kind, by_id[id].state) for id, kind in held]
