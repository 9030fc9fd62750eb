"""Django task framework tasks for the peers built on it (django-tasks-db, django-ox)."""

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]

from . import io_calls, probe, relay_calls


@task
def noop(n: int = 0) -> None:
    probe.noop()


@task
def stamp(key: str) -> Any:
    probe.stamp(key)


@task
def io_sleep(fail: bool = False) -> None:
    io_calls.sync_call("sleep", fail)


@task
def io_http(fail: bool = False) -> None:
    io_calls.sync_call("http", fail)


@task
def relay(target: str, key: str, at: float) -> None:
    """Deliver; on a 429 enqueue the delivery again for after ``Retry-After``.

    Django's task framework has no retry and no snooze, so a new task with
    ``run_after`` is the way to be called later; a failure is final.
    """
    from datetime import timedelta

    from django.utils import timezone

    try:
        relay_calls.deliver_sync(target, key, at)
    except relay_calls.Snooze as snooze:
        later = timezone.now() + timedelta(seconds=snooze.after)
        relay.using(run_after=later).enqueue(target=target, key=key, at=at)
