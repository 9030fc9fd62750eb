"""The example shop's daily digest: a schedule, its handler, and its row in the admin."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client, override_settings
from prometheus_client import REGISTRY

from django_intents import Attempt, Stop
from django_intents.models import Intent
from django_intents.observability import metrics
from django_intents.schedules import enqueue_due
from example_project import settings as example_settings

from .shoputil import shop_app  # noqa: F401 - an autouse fixture: installs the shop
from .test_admin import CHANGELIST

with override_settings(INSTALLED_APPS=["django_intents", "example_project.shop"]):
    from example_project.shop.digest import daily_digest
    from example_project.shop.models import Order

pytestmark = pytest.mark.django_db

SHOP_INTENTS = override_settings(INTENTS=example_settings.INTENTS)
PARIS_MORNING = datetime(2026, 7, 2, 4, 0, 30, tzinfo=UTC)  # 06:00:30 in Paris (CEST)


def order(at: str, total: str) -> None:
    Order.objects.create(customer="c", item="i", total=Decimal(total), created_at=at)


@SHOP_INTENTS
def test_the_digest_logs_the_orders_of_the_shop_day_before_its_slot(caplog):
    order("2026-06-30T21:59:00Z", "1.00")  # 23:59 on 30 June in Paris: not the day before
    order("2026-06-30T22:00:00Z", "2.50")  # 00:00 on 1 July in Paris
    order("2026-07-01T21:59:59Z", "4.00")  # 23:59:59 on 1 July
    order("2026-07-01T22:00:00Z", "8.00")  # 2 July: the slot's own day
    [id] = enqueue_due(now=PARIS_MORNING, kinds=["digest"])
    intent = Intent.objects.get(pk=id)
    assert intent.event_id == "schedule:daily-digest:2026-07-02T04:00:00Z"
    with caplog.at_level(logging.INFO, logger="example_project.shop.digest"):
        daily_digest(intent, Attempt(intent))
    assert caplog.messages == [
        "digest for 2026-07-01 (Europe/Paris): 2 order(s), 6.50 taken; sent to ops@shop.example"
    ]


def test_the_digest_stops_on_an_intent_that_is_not_a_slot():
    intent = Intent(id="x", kind="digest", event_id="by-hand", target="t", payload=None)
    with pytest.raises(Stop, match="'by-hand' is not a schedule slot"):
        daily_digest(intent, Attempt(intent))
    assert Intent.objects.count() == 0


@SHOP_INTENTS
def test_the_shop_admin_lists_the_digest_schedule(admin_client: Client):
    enqueue_due(now=PARIS_MORNING, kinds=["digest"])
    page = admin_client.get(CHANGELIST).content.decode()
    assert '<tr data-schedule="daily-digest">' in page
    assert '<td data-slot="last">2026-07-02T04:00:00Z</td>' in page


@SHOP_INTENTS
def test_the_digest_keeps_its_own_metric_label_without_metric_kinds():
    assert "METRIC_KINDS" not in example_settings.INTENTS
    [id] = enqueue_due(now=PARIS_MORNING, kinds=["digest"])
    assert metrics.kind_label("digest") == "digest"  # declared by INTENTS["HANDLERS"]
    metrics.QUEUE.invalidate()
    assert (
        REGISTRY.get_sample_value(
            "django_intents_pending", {"kind": "digest", "database": "default"}
        )
        == 1
    )
    assert Intent.objects.get(pk=id).state == "pending"
