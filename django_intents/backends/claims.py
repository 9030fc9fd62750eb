"""What a claim is asked with and what it answers: shared by every backend and the manager.

Kept apart from ``base.py`` so that the SQL of the base backend stays under
the module length limit (``tests/test_shape.py``) as it grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..limits import Limit

if TYPE_CHECKING:
    from ..models import Intent


@dataclass(frozen=True)
class ClaimFilters:
    """The optional conditions of a claim or a due probe, as the manager checked them."""

    kinds: list[str] | None = None  # None: every kind
    since: datetime | None = None  # leave out intents due before this (the claim floor)
    max_attempts: int | None = None  # leave out expired leases that used the last attempt
    # The limits of the kinds claimed (``limits.py``); empty: the claim is unlimited.
    limits: Mapping[str, Limit] = field(default_factory=dict)
    # Set by a limited claim for its scan: kinds and (kind, target) pairs with no room left.
    full_kinds: tuple[str, ...] = ()
    full_targets: tuple[tuple[str, str], ...] = ()


def exclusions(filters: ClaimFilters) -> tuple[str, list[Any]]:
    """The SQL that leaves out what a limit has no room for: portable, no row values."""
    where, params = "", []
    if filters.full_kinds:
        where = f" AND kind NOT IN ({', '.join(['%s'] * len(filters.full_kinds))})"
        params += filters.full_kinds
    if filters.full_targets:
        pairs = " OR ".join(["(kind = %s AND target = %s)"] * len(filters.full_targets))
        where += f" AND NOT ({pairs})"
        params += [value for pair in filters.full_targets for value in pair]
    return where, params


Claimed = tuple["Intent", datetime | None]  # the intent, and the lease it took over, if any


def claim_order(intent: Intent) -> tuple[datetime, datetime, str]:
    """The order claims take intents in (``Intent.Meta.ordering``), for sorting in Python."""
    return (intent.next_at, intent.created_at, intent.id)
