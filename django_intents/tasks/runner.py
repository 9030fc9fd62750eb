"""The handler of ``django.tasks`` intents: run one task in the worker pool.

The pool claims a task intent like any other and calls ``run_task(intent,
attempt)``. The outcome follows the handler contract, so leases and fencing
apply to tasks unchanged: returning completes the intent; raising fails the
task (``Stop``: the intent is cancelled with the error), as Django's task API
says, unless the backend's ``OPTIONS["MAX_ATTEMPTS"]`` leaves attempts, when
the exception itself is raised again for the intents backoff to retry. What
Django's API adds — start times, worker ids, errors with tracebacks, the
return value — is written into the payload, fenced by the claim token like
every transition, so a worker that lost its claim can write nothing.

Everything the task raises is caught here, ``SystemExit`` and
``KeyboardInterrupt`` included: they fail the task, never the worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, Protocol, TypeVar, runtime_checkable

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections, connections, router
from django.dispatch import Signal

from django_intents.conf import get_settings
from django_intents.exceptions import ClaimLost, Stop
from django_intents.handlers import Handler
from django_intents.rules.retries import counted, gives_up
from django_intents.rules.states import State
from django_intents.rules.validation import exception_text
from django_intents.store.clock import server_now
from django_intents.tasks.compat import (
    InvalidTask,
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_intents.tasks.record import (
    UNREADABLE,
    TaskRecord,
    check_storable,
    load_task,
    make_result,
)

if TYPE_CHECKING:
    from django_intents.attempt import Attempt
    from django_intents.models import Intent

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


@runtime_checkable
class _Backend(Protocol):
    """What the runner needs of the backend that stored a task: ``backend.IntentsBackend``.

    Described, not imported: that backend registers this runner as a handler,
    so importing it here would make the two modules import each other.
    """

    max_attempts: int | None

    def task_for(self, record: TaskRecord) -> Task[Any, Any]: ...


def run_task(intent: Intent, attempt: Attempt) -> None:
    """Run the task a claimed intent records and write its outcome into the payload."""
    # A pool that is shutting down hands the intent back instead of starting it.
    attempt.check()
    backend, task, record, result = _start(intent)
    try:
        value = task.call(*_arguments(task, record, result), **record.kwargs)
    except BaseException as exc:  # noqa: B036 - a task's exit or interrupt fails the task
        _failed(intent, backend, task, record, exc, final=_is_final(exc, intent, backend))
    _succeeded(intent, attempt, backend, task, record, value)


async def run_task_async(intent: Intent, attempt: Attempt) -> None:
    """Run an ``async def`` task on the pool's event loop, as ``run_task`` runs the others.

    The task is awaited where it runs, not wrapped in a per-task
    ``async_to_sync``; the runner's own writes (its start, its outcome, the
    completion) go to one thread (``_written``), so one connection serves
    every async task of the process.
    """
    attempt.check()
    try:
        backend, task, record, result = await _written(_start)(intent)
        try:
            value = await task.acall(*_arguments(task, record, result), **record.kwargs)
        except asyncio.CancelledError:
            raise  # the claim was lost: nothing of this attempt may be written
        except BaseException as exc:  # noqa: B036 - a task's exit or interrupt fails the task
            final = _is_final(exc, intent, backend)
            await _written(_failed)(intent, backend, task, record, exc, final=final)
        await _written(_succeeded)(intent, attempt, backend, task, record, value)
    finally:
        # That thread's connection follows CONN_MAX_AGE, as a worker thread's does.
        await _written(close_old_connections)()


# The thread of the runner's own writes for async tasks. Not Django's
# thread-sensitive one: inside async_to_sync (a pool drained from an async
# test, say) that is the caller's thread, which is waiting for the pool.
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="intents-task-writes")


def _written(func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    return sync_to_async(func, thread_sensitive=False, executor=_WRITER)


def for_intent(intent: Intent) -> Handler:
    """The runner of this intent's task: ``run_task_async`` for an ``async def`` task.

    The pool asks this of the task kind's handler for every claim (one kind
    holds both), and awaits an async task on its event loop.
    """
    try:
        path = TaskRecord.from_payload(intent.payload).path
        func = getattr(load_task(path), "func", None)
    except (*UNREADABLE, ImportError):
        return run_task  # which says why the task cannot run
    return run_task_async if inspect.iscoroutinefunction(func) else run_task


# How the pool finds the chooser (execution.resolve); a plain function stays the handler.
run_task.for_intent = for_intent  # type: ignore[attr-defined]


def _start(intent: Intent) -> tuple[_Backend, Task[Any, Any], TaskRecord, TaskResult[Any, Any]]:
    """Load the task and record its start; ``Stop`` if the record cannot name a task."""
    try:
        record = TaskRecord.from_payload(intent.payload)
        backend = _backend(record.backend)
        task = backend.task_for(record)
    except UNREADABLE as exc:
        # Never retried: the stored path or options will not get better by waiting.
        raise Stop(f"cannot run this task: {exc}") from exc
    now = server_now(intent._state.db)
    record.worker_ids.append(worker_id())
    record.started_at = record.started_at or now
    record.last_attempted_at = now
    _save(intent, record)
    result = make_result(task, intent, record, TaskResultStatus.RUNNING)
    _send(task_started, backend, result)
    return backend, task, record, result


def _arguments(task: Task[Any, Any], record: TaskRecord, result: TaskResult[Any, Any]) -> list[Any]:
    if task.takes_context:
        return [TaskContext(task_result=result), *record.args]
    return list(record.args)


def _succeeded(
    intent: Intent,
    attempt: Attempt,
    backend: _Backend,
    task: Task[Any, Any],
    record: TaskRecord,
    value: Any,
) -> None:
    try:
        # A value that would not read back as it is fails the task: retrying
        # would return the same value again.
        record.return_value = check_storable(normalize_json(value), "the return value")
    except (TypeError, ValueError) as exc:
        _failed(intent, backend, task, record, exc, final=True)
    record.has_return_value = True
    finished = server_now(intent._state.db)
    # The result and the completion commit together, fenced by the claim.
    with attempt.atomic():
        _save(intent, record)
    _send(
        task_finished,
        backend,
        make_result(task, intent, record, TaskResultStatus.SUCCESSFUL, finished),
    )


def worker_id() -> str:
    """``host:pid`` of this worker process: what ``TaskResult.worker_ids`` lists."""
    return f"{socket.gethostname()[:50]}:{os.getpid()}"


def _failed(
    intent: Intent,
    backend: _Backend,
    task: Task[Any, Any],
    record: TaskRecord,
    exc: BaseException,
    *,
    final: bool,
) -> NoReturn:
    """Record ``exc``, tell receivers, and raise what makes the worker retry or cancel.

    Called inside the ``except`` block, so receivers of ``task_finished`` (Django
    logs failures from there) still see the exception in ``sys.exc_info()``;
    an exception caught in another thread (an async task's) is raised here
    again first, for the same reason.
    """
    if sys.exc_info()[1] is not exc:
        try:
            raise exc
        except BaseException:  # noqa: B036 - _failed raises what the worker needs
            _failed(intent, backend, task, record, exc, final=final)
    if isinstance(exc, DatabaseError):
        # The task may have broken this thread's connection; the payload is next.
        connections[router.db_for_write(type(intent))].close_if_unusable_or_obsolete()
    record.add_error(exc)
    try:
        _save(intent, record)
    except ClaimLost as lost:
        raise lost from exc
    status = TaskResultStatus.FAILED if final else TaskResultStatus.READY
    finished = server_now(intent._state.db) if final else None
    _send(task_finished, backend, make_result(task, intent, record, status, finished))
    if isinstance(exc, Stop):
        raise exc
    if final:
        raise Stop(exception_text(exc)) from exc
    raise exc  # the worker retries it with backoff


def _send(signal: Signal, backend: _Backend, result: TaskResult[Any, Any]) -> None:
    """Send a task signal; a failing receiver is logged, it never changes the outcome."""
    for receiver, error in signal.send_robust(type(backend), task_result=result):
        if isinstance(error, Exception):
            log.error(
                "task %s %s: signal receiver %r failed",
                result.task.module_path,
                result.id[:12],
                receiver,
                exc_info=error,
            )


def _is_final(exc: BaseException, intent: Intent, backend: _Backend) -> bool:
    """Does this failure end the task, or will it run again?

    Both bounds apply: the backend's ``MAX_ATTEMPTS`` (1 unless configured) and
    ``INTENTS["MAX_ATTEMPTS"]``, which bounds every intent.
    """
    if isinstance(exc, Stop) or not isinstance(exc, Exception):
        return True  # Stop, SystemExit, KeyboardInterrupt, ...
    limits = (backend.max_attempts, get_settings().max_attempts)
    return any(gives_up(counted(intent), limit) for limit in limits)


def _save(intent: Intent, record: TaskRecord) -> None:
    """Write the record, only while this attempt still holds the claim."""
    saved = (
        type(intent)
        .objects.db_manager(router.db_for_write(type(intent)))
        .filter(pk=intent.id, state=State.RUNNING, claim_token=intent.claim_token)
        .update(payload=record.to_payload())
    )
    if not saved:
        raise ClaimLost(f"intent {intent.id} was fenced while its task ran; its outcome is dropped")


def _backend(alias: str) -> _Backend:
    backend = task_backends[alias]
    if not isinstance(backend, _Backend):
        raise InvalidTask(f"TASKS[{alias!r}] is {type(backend).__name__}, not IntentsBackend")
    return backend
