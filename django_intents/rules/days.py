"""The days PostgreSQL's partitions of finished intents are numbered by (migration 0018)."""

from __future__ import annotations

from datetime import datetime

SECONDS_A_DAY = 86_400


def day_of(moment: datetime) -> int:
    """The day ``moment`` (aware) falls on: whole days since 1970-01-01, UTC."""
    return int(moment.timestamp() // SECONDS_A_DAY)
