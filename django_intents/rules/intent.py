"""What the rules and the store read of an intent, without importing the model.

The model sits above the store (its manager calls the store), so the store
and the rules name an intent by this protocol; ``models.Intent`` satisfies it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class IntentRow(Protocol):
    """The fields of a stored intent that claims, limits and results read."""

    id: str
    kind: str
    event_id: str
    target: str
    payload: Any
    state: str
    priority: int
    attempts: int
    snoozes: int
    written_off: int
    next_at: datetime
    created_at: datetime
    updated_at: datetime
    last_error: str
    claim_token: str
    claim_until: datetime | None
