"""What a claim is asked with and what it answers: shared by every backend and the manager.

Kept apart from ``base.py`` so that the SQL of the base backend stays under
the module length limit (``tests/test_shape.py``) as it grows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import Intent


@dataclass(frozen=True)
class ClaimFilters:
    """The optional conditions of a claim or a due probe, as the manager checked them."""

    kinds: list[str] | None = None  # None: every kind
    since: datetime | None = None  # leave out intents due before this (the claim floor)
    max_attempts: int | None = None  # leave out expired leases that used the last attempt


Claimed = tuple["Intent", datetime | None]  # the intent, and the lease it took over, if any
