"""How a task lives in an intent's payload, and how it reads back as a ``TaskResult``.

The payload is the whole record of a task: what to call (the task's import
path, its arguments, the options it was enqueued with) and what happened to it
(worker ids, start times, errors, the return value). The intent's own columns
hold the rest: ``state`` is the status, ``created_at`` the enqueue time and, once
finished, ``updated_at`` the finish time. Keeping the record in the payload needs
no table of its own, and ``INTENTS["RETENTION"]`` removes a result with its intent.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_intents.rules.states import State
from django_intents.rules.validation import check_json
from django_intents.tasks.compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow

# A task retried for days would otherwise carry every traceback it ever raised.
MAX_ERRORS = 10
MAX_TRACEBACK = 20_000

STATUS: dict[str, TaskResultStatus] = {
    State.PENDING: TaskResultStatus.READY,
    State.RUNNING: TaskResultStatus.RUNNING,
    State.COMPLETED: TaskResultStatus.SUCCESSFUL,
    State.CANCELLED: TaskResultStatus.FAILED,
}


class MalformedRecord(ValueError):
    """The payload of a task intent is not a task record (edited, or compacted by retention)."""


# What reading a stored task back may raise: a payload that is not a record, a
# path that names no task, options the task's backend no longer accepts.
UNREADABLE = (MalformedRecord, InvalidTask, ImproperlyConfigured)


@dataclass
class TaskRecord:
    """One task intent's payload, as typed fields."""

    path: str
    args: list[Any]
    kwargs: dict[str, Any]
    backend: str
    queue_name: str
    priority: int
    run_after: datetime | None = None
    idempotency_key: str | None = None
    worker_ids: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    last_attempted_at: datetime | None = None
    errors: list[TaskError] = field(default_factory=list)
    has_return_value: bool = False
    return_value: Any = None

    @classmethod
    def of(cls, task: Task[..., Any], args: Any, kwargs: Any, backend: str) -> TaskRecord:
        """The record of ``task`` enqueued with ``args`` and ``kwargs`` on ``backend``;
        ``ValueError`` if they would not read back from JSON as they are."""
        return cls(
            path=task.module_path,
            args=check_storable(args, "args"),
            kwargs=check_storable(kwargs, "kwargs"),
            backend=backend,
            queue_name=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            idempotency_key=getattr(task, "idempotency_key", None),
        )

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "task": self.path,
            "args": self.args,
            "kwargs": self.kwargs,
            "backend": self.backend,
            "queue_name": self.queue_name,
            "priority": self.priority,
            "run_after": _iso(self.run_after),
            "idempotency_key": self.idempotency_key,
            "worker_ids": self.worker_ids,
            "started_at": _iso(self.started_at),
            "last_attempted_at": _iso(self.last_attempted_at),
            "errors": [
                {"exception_class_path": e.exception_class_path, "traceback": e.traceback}
                for e in self.errors
            ],
        }
        if self.has_return_value:
            payload["return_value"] = self.return_value
        return payload

    @classmethod
    def from_payload(cls, payload: Any) -> TaskRecord:
        """Read a payload back; raise ``MalformedRecord`` if it is not one this module wrote."""
        if not isinstance(payload, dict):
            raise MalformedRecord(f"the payload is {type(payload).__name__}, not a task record")
        try:
            record = cls(
                path=_typed(payload, "task", str),
                args=_typed(payload, "args", list),
                kwargs=_typed(payload, "kwargs", dict),
                backend=_typed(payload, "backend", str),
                queue_name=_typed(payload, "queue_name", str),
                priority=_typed(payload, "priority", int),
                run_after=_datetime(payload.get("run_after")),
                idempotency_key=_optional_str(payload.get("idempotency_key")),
                worker_ids=[str(worker) for worker in payload.get("worker_ids") or []],
                started_at=_datetime(payload.get("started_at")),
                last_attempted_at=_datetime(payload.get("last_attempted_at")),
                errors=[
                    TaskError(
                        exception_class_path=str(error["exception_class_path"]),
                        traceback=str(error["traceback"]),
                    )
                    for error in payload.get("errors") or []
                ],
                has_return_value="return_value" in payload,
                return_value=payload.get("return_value"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedRecord(f"the payload is not a task record: {exc}") from exc
        return record

    def add_error(self, exc: BaseException) -> None:
        """Record ``exc`` with its traceback, keeping the most recent ``MAX_ERRORS``."""
        kind = type(exc)
        text = "".join(traceback.format_exception(exc))
        if len(text) > MAX_TRACEBACK:
            # The end of a traceback names the exception; keep that part.
            text = "…" + text[-(MAX_TRACEBACK - 1) :]
        # Stored as JSON: PostgreSQL refuses NUL, and lone surrogates are not UTF-8.
        text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
        path = f"{kind.__module__}.{kind.__qualname__}"
        error = TaskError(exception_class_path=path, traceback=text)
        self.errors = [*self.errors, error][-MAX_ERRORS:]


def check_storable(value: Any, path: str) -> Any:
    """Return ``value`` if it reads back from a JSON column exactly as it is.

    Django's ``normalize_json`` has already refused what JSON has no type for;
    this refuses what it lets through but a JSON column would change or reject:
    non-string keys, NaN and infinity, NUL characters, lone surrogates.
    """
    return check_json(value, path)


def load_task(path: str) -> Task[..., Any]:
    """Return the task defined at ``path``; refuse anything else.

    The path comes from the database, so it must never name arbitrary code: only
    an object made by the ``@task`` decorator, found under its own name, runs.
    """
    try:
        found = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"cannot import the task {path!r}: {exc}") from exc
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a task (a function decorated with @task)")
    if found.module_path != path:
        raise InvalidTask(f"{path!r} is the task {found.module_path!r} under another name")
    return found


def make_result(
    task: Task[..., Any],
    intent: IntentRow,
    record: TaskRecord,
    status: TaskResultStatus,
    finished_at: datetime | None = None,
) -> TaskResult[..., Any]:
    """The ``TaskResult`` of ``intent``, whose payload is ``record``, in ``status``."""
    result: TaskResult[..., Any] = TaskResult(
        task=task,
        id=intent.id,
        status=status,
        enqueued_at=intent.created_at,
        started_at=record.started_at,
        finished_at=finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=list(record.errors),
        worker_ids=list(record.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", record.return_value)  # frozen dataclass
    return result


def _typed(payload: dict[str, Any], key: str, kind: type) -> Any:
    value = payload[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise TypeError(f"{key!r} is {type(value).__name__}, not {kind.__name__}")
    return value


def _optional_str(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"'idempotency_key' is {type(value).__name__}, not str")
    return value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _datetime(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
