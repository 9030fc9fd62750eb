"""Django task framework tasks for the peers built on it (django-tasks-db, django-ox)."""

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]

from . import io_calls, probe


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
