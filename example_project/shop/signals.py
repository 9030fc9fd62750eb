"""Signal receivers: a saved order records a push for its customer.

Connected in :meth:`ShopConfig.ready`. A ``post_save`` receiver runs in the
transaction of the ``save()`` that sent it, so the intent commits or rolls back
with the order, as long as the order is saved inside ``transaction.atomic()``
(the admin, ``Order.objects.place`` and ``ATOMIC_REQUESTS`` all do that). Saved
in autocommit mode, the order would commit a moment before its intent.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from django_intents.models import Intent

from .models import Order


@receiver(post_save, sender=Order, dispatch_uid="shop.order_saved_push")
def order_saved_push(sender: type[Order], instance: Order, using: str, **kwargs: Any) -> None:
    """Record the push for the order's current status (once per order and status)."""
    kind, event_id, target = instance.push_intent()
    # The database the order was saved to: its transaction is the one to join.
    Intent.objects.db_manager(using).enqueue(
        kind,
        event_id=event_id,
        target=target,
        payload={"order": instance.pk, "message": instance.push_message()},
    )
