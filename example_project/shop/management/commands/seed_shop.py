"""``manage.py seed_shop``: an admin account and a few orders to watch being processed."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.urls import reverse

from ...models import Order
from ...tasks import send_receipt

ADMIN_USERNAME = "admin"
ADMIN_PASSWORD = "admin"

# (customer, item, total, how the partner treats its webhook, push inline): every
# path of the demo: delivered, retried with backoff (once for sure, more at random
# with --fail), cancelled by the partner's 410, pushed inline.
SAMPLES = [
    ("ada@example.com", "Espresso machine", "249.00", "ok", False),
    ("grace@example.com", "Coffee beans, 1 kg", "18.50", "ok", True),
    ("linus@example.com", "Burr grinder", "89.00", "flaky", False),
    ("margaret@example.com", "Milk jug", "12.00", "recovering", False),
    ("barbara@example.com", "Knock box", "25.00", "flaky", True),
    ("ken@example.com", "Descaler", "9.90", "gone", False),
]


def partner(behaviour: str, fail: float) -> tuple[str, str]:
    """The receiver's query string for ``behaviour``, and what it means."""
    return {
        "ok": ("", "the partner accepts it"),
        "recovering": ("?fail_first=1", "the partner refuses the first attempt: one retry"),
        "flaky": (f"?fail={fail:g}", f"the partner refuses {fail:.0%} of deliveries"),
        "gone": ("?status=410", "the partner answers 410 Gone: cancelled"),
    }[behaviour]


def fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError(f"{value} is not between 0 and 1")
    return number


class Command(BaseCommand):
    help = "Create the admin/admin superuser if missing, and place a few sample orders."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--site",
            default="http://127.0.0.1:8000",
            help="where the site will run; sample webhooks go to its receiver",
        )
        parser.add_argument(
            "--fail",
            type=fraction,
            default=0.5,
            help="fraction of deliveries the receiver refuses for the flaky samples",
        )

    def handle(self, *args: Any, site: str, fail: float, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(username=ADMIN_USERNAME).exists():
            self.stdout.write(f"superuser {ADMIN_USERNAME!r} already exists")
        else:
            users.objects.create_superuser(ADMIN_USERNAME, "admin@example.com", ADMIN_PASSWORD)
            self.stdout.write(f"created superuser {ADMIN_USERNAME!r} (password {ADMIN_PASSWORD!r})")

        receiver = site.rstrip("/") + reverse("shop:receive-webhook")
        orders = []
        for customer, item, total, behaviour, push_inline in SAMPLES:
            query, meaning = partner(behaviour, fail)
            # As the order view does: the order, its intents and its receipt task together.
            with transaction.atomic():
                order = Order.objects.place(
                    customer=customer,
                    item=item,
                    total=Decimal(total),
                    partner_url=receiver + query,
                    push_inline=push_inline,
                )
                send_receipt.enqueue(order.pk)
            orders.append(order)
            push = "; push sent inline" if push_inline else ""
            self.stdout.write(
                f"placed order #{order.pk} ({item}): receipt task; webhook, {meaning}{push}"
            )

        # A status change is a second save: post_save records the "shipped" push.
        with transaction.atomic():
            first = orders[0]
            first.status = Order.Status.SHIPPED
            first.save(update_fields=["status"])
        self.stdout.write(f"shipped order #{first.pk}")
