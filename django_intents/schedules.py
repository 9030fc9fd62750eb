"""``django_intents.schedules``: the public path of SPEC §11's ``enqueue_due``.

The schedules themselves live in ``maintenance.schedules``; this path stays
because projects import ``enqueue_due`` from here.
"""

from django_intents.maintenance.schedules import enqueue_due, listing, schedules

__all__ = ["enqueue_due", "listing", "schedules"]
