"""The state machine's vocabulary, written once: the states, and what "due" means.

A leaf module, so that settings, the manager, the backends and the admin can
all speak of states without importing the model. ``Intent.State`` is this
class; the raw SQL form of ``due`` is ``backends.base.DUE``, which a test
holds equal to this one.
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
