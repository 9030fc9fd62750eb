"""The state machine's vocabulary, written once: the states, and what "due" means.

A leaf module, so that settings, the manager, the store and the admin can
all speak of states without importing the model. ``Intent.State`` is this
class; the store's SQL spells ``due`` and the claim order from the
definitions here, and a test holds the two forms equal.
"""

from __future__ import annotations

from datetime import datetime

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


def order_by_sql(order: tuple[str, ...] = CLAIM_ORDER) -> str:
    """``order`` as the body of an SQL ``ORDER BY`` (column names are the field names)."""
    return ", ".join(f"{f[1:]} DESC" if f.startswith("-") else f for f in order)


def due(now: datetime) -> models.Q:
    """What a claim at ``now`` could take: a due pending intent, or an expired lease."""
    return models.Q(state=State.PENDING, next_at__lte=now) | models.Q(
        state=State.RUNNING, claim_until__lte=now
    )


def due_since() -> models.Case:
    """When a due intent became claimable: ``next_at``, or the end of its expired lease."""
    return models.Case(
        models.When(state=State.PENDING, then=models.F("next_at")),
        default=models.F("claim_until"),
    )
