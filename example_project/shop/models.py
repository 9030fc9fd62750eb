"""An order, and where its side effects land: a push log, a partner's inbox, a receipt."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from django_intents import intent_id
from django_intents.models import Intent


class OrderManager(models.Manager["Order"]):
    def place(
        self,
        *,
        customer: str,
        item: str,
        total: Decimal,
        partner_url: str,
        push_inline: bool = False,
    ) -> Order:
        """Create an order and record its side effects in the same transaction.

        The ``order.placed`` webhook is recorded here; the push is recorded by the
        ``post_save`` receiver (shop/signals.py), which runs inside this transaction
        too. If anything below raises, the order and both intents roll back together:
        no webhook about an order that does not exist, no order without its webhook.

        With ``push_inline`` the push is delivered right here instead of by a worker
        (it is only a row in the same database), and ``complete_pending`` marks its
        intent completed in the same transaction, so no worker will send it again.
        """
        with transaction.atomic():
            order = self.create(customer=customer, item=item, total=total)
            Intent.objects.enqueue(
                "webhook",
                event_id=f"order-{order.pk}-placed",
                target=partner_url,
                payload={"event": "order.placed", "order": order.as_json()},
            )
            if push_inline:
                kind, event_id, target = order.push_intent()
                push_id = intent_id(kind, event_id, target)
                # Completing first means the inline push happens only if no worker
                # has (or will ever) run this intent: exactly once, here or there.
                if Intent.objects.complete_pending(push_id):
                    PushLog.objects.create(
                        intent_id=push_id,
                        recipient=target,
                        message=order.push_message(),
                        sent_by=PushLog.SentBy.INLINE,
                    )
        return order


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed"
        SHIPPED = "shipped"

    customer = models.CharField(max_length=100)
    item = models.CharField(max_length=200)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(
        max_length=max(len(value) for value in Status.values),
        choices=Status.choices,
        default=Status.PLACED,
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = OrderManager()

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"Order #{self.pk}: {self.item} for {self.customer}"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "customer": self.customer,
            "item": self.item,
            "total": str(self.total),
            "status": self.status,
        }

    def push_intent(self) -> tuple[str, str, str]:
        """``(kind, event_id, target)`` of the push announcing the current status.

        One push per order and status: saving an order again without changing its
        status records the same intent id, which ``enqueue`` stores only once.
        """
        return "push", f"order-{self.pk}-{self.status}", f"customer:{self.customer}"

    def push_message(self) -> str:
        return f"Order #{self.pk} {self.status}: {self.item}"


class PushLog(models.Model):
    """Stands in for a push service: one row per notification sent.

    ``intent_id`` is unique, so even a bug that ran a push twice could not show
    the customer two notifications.
    """

    class SentBy(models.TextChoices):
        WORKER = "worker"
        INLINE = "inline"

    intent_id = models.CharField(max_length=64, unique=True)
    recipient = models.CharField(max_length=200)
    message = models.CharField(max_length=300)
    sent_by = models.CharField(
        max_length=max(len(value) for value in SentBy.values), choices=SentBy.choices
    )
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-sent_at", "-id")

    def __str__(self) -> str:
        return f"push to {self.recipient}: {self.message}"


class ReceivedWebhook(models.Model):
    """The partner's inbox: each delivery stored once, keyed by its Idempotency-Key.

    The unique ``key`` is what makes at-least-once delivery safe to receive: a
    retried delivery finds its key taken and only counts as another delivery.
    """

    key = models.CharField(max_length=255, unique=True)
    payload = models.JSONField()
    attempt = models.PositiveIntegerField(default=0, help_text="The sender's attempt that got in.")
    deliveries = models.PositiveIntegerField(default=1, help_text="Including duplicates.")
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-received_at", "-id")

    def __str__(self) -> str:
        return f"webhook {self.key[:12]} ({self.deliveries} deliveries)"


class Receipt(models.Model):
    """Stands in for a receipt e-mail: written by the ``send_receipt`` task (shop/tasks.py).

    One per order (``order`` is unique), so a task that runs twice (a worker died
    after writing it, and the lease expired) still sends one receipt.
    """

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="receipt")
    recipient = models.CharField(max_length=100)
    text = models.CharField(max_length=300)
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-sent_at", "-id")

    def __str__(self) -> str:
        return f"receipt to {self.recipient}: {self.text}"


class PartnerManager(models.Manager["Partner"]):
    def current(self) -> Partner:
        """The partner's settings: the stored row, or the defaults until someone saves them.

        Reading never writes, so the receiver costs one SELECT per delivery.
        """
        return self.filter(pk=Partner.SINGLETON).first() or Partner(pk=Partner.SINGLETON)


class Partner(models.Model):
    """How the shop's own receiver plays the partner, switched on the partner page.

    A row rather than the cache: it survives a restart of the site, and every
    web process reads the same one (the example's default cache, local memory,
    is per process). There is one row, with ``pk`` 1.
    """

    SINGLETON = 1

    # A plain key, not an auto-increment one: MariaDB refuses a CHECK on an
    # AUTO_INCREMENT column, and the one row's key is always 1 anyway.
    id = models.PositiveSmallIntegerField(primary_key=True, default=SINGLETON, editable=False)

    class Mode(models.TextChoices):
        NORMAL = "normal", "Answer normally (as each webhook URL's query says)"
        LIMITED = "limited", "Rate-limited: 429 with Retry-After above N requests per second"
        THROTTLED = "throttled", "Always 429 with Retry-After"
        HANG = "hang", "Hang past the webhook handler's timeout, then answer 503"

    mode = models.CharField(
        max_length=max(len(value) for value in Mode.values),
        choices=Mode.choices,
        default=Mode.NORMAL,
    )
    rate = models.PositiveIntegerField(
        "requests per second",
        default=2,
        validators=[MinValueValidator(1)],
        help_text="Rate-limited: deliveries accepted per second; the others get 429.",
    )
    retry_after = models.PositiveIntegerField(
        "Retry-After (seconds)",
        default=10,
        validators=[MaxValueValidator(24 * 3600)],
        help_text="How long a 429 asks the sender to wait.",
    )
    retry_after_as_date = models.BooleanField(
        "send Retry-After as an HTTP date",
        default=False,
        help_text="The other form the header may take: a time (GMT), not a number of seconds.",
    )
    changed_at = models.DateTimeField(auto_now=True)

    objects = PartnerManager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="shop_partner_singleton"),
        ]

    def __str__(self) -> str:
        return f"partner: {self.get_mode_display()}"
