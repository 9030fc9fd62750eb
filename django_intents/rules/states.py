"""The state machine's vocabulary, written once: the states, the claim order, due and live.

A leaf module, so that settings, the manager, the store and the admin can
all speak of states without importing the model. ``Intent.State`` is this
class. The store's SQL spells ``due``, the live lease and the claim order
from the definitions here, and a test holds the two forms equal.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models


class State(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


ACTIVE = (State.PENDING, State.RUNNING)
TERMINAL = (State.COMPLETED, State.CANCELLED)
ALL = tuple(State)

# The order claims take due intents in: higher priority first, then the
# earliest due, the oldest, and the id to break ties. The model's ordering,
# the manager's reads, the store's ORDER BY and the pool's local queue all
# follow this one tuple.
CLAIM_ORDER = ("-priority", "next_at", "created_at", "id")

# The claim columns of an intent no one holds: a new intent's, and what every
# transition out of ``running`` writes (complete, retry, cancel, release).
NO_CLAIM: dict[str, Any] = {"claim_token": "", "claim_until": None}


def order_by_sql(order: tuple[str, ...] = CLAIM_ORDER) -> str:
    """``order`` as the body of an SQL ``ORDER BY`` (column names are the field names)."""
    return ", ".join(f"{f[1:]} DESC" if f.startswith("-") else f for f in order)


def live(now: datetime) -> models.Q:
    """A lease still held at ``now``: it counts toward ``LIMITS``, and no claim takes it."""
    return models.Q(state=State.RUNNING, claim_until__gt=now)


def expired(now: datetime) -> models.Q:
    """A lease that ran out by ``now``: its intent is due again, its holder fenced off."""
    return models.Q(state=State.RUNNING, claim_until__lte=now)


def due(now: datetime) -> models.Q:
    """What a claim at ``now`` could take: a due pending intent, or an expired lease."""
    return models.Q(state=State.PENDING, next_at__lte=now) | expired(now)


def due_since() -> models.Case:
    """When a due intent became claimable: ``next_at``, or the end of its expired lease."""
    return models.Case(
        models.When(state=State.PENDING, then=models.F("next_at")),
        default=models.F("claim_until"),
    )
