"""Tasks the django.tasks backend tests enqueue, through the standard ``@task`` API.

Which module provides ``task`` depends on the Django version: ``django.tasks``
on 6.x, the ``django-tasks`` backport on 5.2. Side effects are ``Effect`` rows,
so a test can see from another process what ran and how often.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

from django_intents import Stop

from .models import Effect

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@task
def record(note: str) -> None:
    """Leave an Effect row behind: how often a task ran, seen from any process."""
    Effect.objects.create(intent_id="task", note=note)


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
def stop(message: str) -> None:
    raise Stop(message)


@task(takes_context=True)
def flaky(context: Any, succeed_on: int) -> int:
    """Fail until the ``succeed_on``-th attempt, then return the attempt number."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return int(context.attempt)


@task
def exits(code: int | None) -> None:
    sys.exit(code)


@task
def calls_exit() -> None:
    exit()  # the builtin a script would call, on purpose


@task
def interrupted() -> None:
    raise KeyboardInterrupt


@task
def returns_a_set() -> Any:
    return {1, 2}


@task
def returns_nan() -> float:
    return float("nan")


@task
def returns_a_tuple() -> tuple[int, str]:
    return (1, "two")


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
async def async_where() -> str:
    """Which thread awaits an async task: the pool's event loop, not a worker thread."""
    await asyncio.sleep(0)
    return threading.current_thread().name


@task
async def async_fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("async task failed")


@task(takes_context=True)
def with_context(context: Any, label: str) -> dict[str, Any]:
    result = context.task_result
    return {
        "label": label,
        "id": result.id,
        "attempt": context.attempt,
        "status": str(result.status),
        "worker_ids": result.worker_ids,
        "task": result.task.module_path,
    }


@task(takes_context=True)
def fenced_midway(context: Any) -> str:
    """An administrator retries the intent while the task runs: the claim is lost."""
    from django_intents.models import Intent

    Intent.objects.retry_now(context.task_result.id)
    return "too late"


def not_a_task(path: str) -> None:
    """A plain function: a stored path naming it must never run."""
    Effect.objects.create(intent_id="task", note=f"not a task {path}")


# The same task under a second name: a stored path must name a task by its own name.
alias_of_add = add
