"""The shop's one ``@task``: the standard Django task API, stored as an intent.

``TASKS`` (example_project/settings.py) names ``IntentsBackend``, so
``send_receipt.enqueue(order.pk)`` stores an intent of kind ``django.tasks`` in
the caller's transaction (see ``views.place_order``), and ``run_intent_workers``
runs it like any other intent: leases, fencing, the admin. A receipt that
raises has failed, as Django's task API says; ``OPTIONS["MAX_ATTEMPTS"]`` in
``TASKS`` would retry it (docs/django-tasks.md, "Retries").
"""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport provides the same API
    from django_tasks import task

from .models import Order, Receipt


@task
def send_receipt(order_id: int) -> dict[str, Any]:
    """Send the order's receipt (a ``Receipt`` row) once, however often the task runs.

    Tasks run at least once, like every intent: the unique ``Receipt.order``
    makes a second run find the receipt the first one wrote.
    """
    order = Order.objects.get(pk=order_id)
    receipt, _ = Receipt.objects.get_or_create(
        order=order,
        defaults={
            "recipient": order.customer,
            "text": f"Thank you for order #{order.pk}: {order.item}, {order.total}",
        },
    )
    return {"receipt": receipt.pk, "sent_to": receipt.recipient}
