"""A Django task backend on top of intents.

``TASKS = {"default": {"BACKEND": "django_intents.tasks.IntentsBackend"}}`` makes
``@task`` functions (``django.tasks`` on Django 6, the ``django-tasks`` backport
on Django 5.2) intents of kind ``django.tasks``: enqueued in the caller's
transaction, run by ``run_intent_workers``, read back with ``get_result``.
See docs/django-tasks.md.
"""

from .backend import IntentsBackend, IntentsTask, register_handler
from .record import TASK_KIND

__all__ = ["TASK_KIND", "IntentsBackend", "IntentsTask", "register_handler"]
