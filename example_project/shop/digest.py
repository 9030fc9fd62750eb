"""The daily digest: a schedule's handler (``INTENTS["SCHEDULES"]["daily-digest"]``).

Every morning at 06:00 shop time each worker pool that runs the ``digest``
kind enqueues that morning's slot; its deterministic id makes it one intent
however many pools there are, so the digest is logged once. The day it
covers is read from the slot (in the event id), not from the clock, so an
attempt retried at 06:05, or a slot caught up after an outage, still reports
the day before its slot.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from django.db.models import Count, Sum

from django_intents import Stop

from .models import Order

if TYPE_CHECKING:
    from django_intents import Attempt
    from django_intents.models import Intent

logger = logging.getLogger(__name__)


def slot_of(intent: Intent) -> datetime:
    """The slot start an intent of a schedule stands for: ``schedule:<name>:<UTC start>``."""
    try:
        _, _, stamp = intent.event_id.split(":", 2)
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise Stop(f"{intent.event_id!r} is not a schedule slot") from None


def daily_digest(intent: Intent, attempt: Attempt) -> None:
    """Log the orders of the shop's day before the slot: how many, and what they took."""
    options = intent.payload if isinstance(intent.payload, dict) else {}
    tz = ZoneInfo(options.get("tz", "UTC"))
    day = slot_of(intent).astimezone(tz).date() - timedelta(days=1)
    start = datetime.combine(day, time(), tzinfo=tz)
    orders = Order.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1))
    totals = orders.aggregate(count=Count("id"), takings=Sum("total"))
    takings = Decimal(totals["takings"] or 0).quantize(Decimal("0.01"))  # SQLite says 6.5
    logger.info(
        "digest for %s (%s): %d order(s), %s taken; sent to %s",
        day.isoformat(),
        tz.key,
        totals["count"],
        takings,
        intent.target,
    )
