"""The task framework this backend plugs into: ``django.tasks`` or its backport.

Django 6.0 ships ``django.tasks``; on Django 5.2 the ``django-tasks`` package
provides the same API as ``django_tasks``. Everything else in this package
imports the framework from here, so the choice is made once. Type checkers
always see ``django.tasks`` (django-stubs describes it on every Django version).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    except ImportError:
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        except ImportError as exc:
            raise ImportError(
                "django_intents.tasks needs django.tasks (Django 6.0+) or, on Django 5.2, "
                "the django-tasks backport (0.12 or later): pip install 'django-intents[tasks]'"
            ) from exc
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    else:
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
