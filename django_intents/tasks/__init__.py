"""A Django task backend on top of intents.

``TASKS = {"default": {"BACKEND": "django_intents.tasks.IntentsBackend"}}`` makes
``@task`` functions (``django.tasks`` on Django 6, the ``django-tasks`` backport
on Django 5.2) intents of kind ``django.tasks``: enqueued in the caller's
transaction, run by ``run_intent_workers``, read back with ``get_result``.
See docs/django-tasks.md.
"""

from django_intents.rules.kinds import TASK_KIND
from django_intents.tasks.backend import IntentsBackend, IntentsTask, register_handler

__all__ = ["TASK_KIND", "IntentsBackend", "IntentsTask", "register_handler"]
