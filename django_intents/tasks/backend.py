"""``IntentsBackend``: Django's task API, stored as intents and run by ``run_intent_workers``.

``enqueue`` is ``Intent.objects.enqueue`` of one intent of kind ``django.tasks``,
in the caller's transaction: a task enqueued in a transaction that rolls back
was never enqueued (the outbox property). ``get_result`` reads the intent back.
Nothing is kept in memory, so any process may ask for any result.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.db import router

from django_intents.handlers import registry
from django_intents.rules.identity import MAX_LENGTHS, check_text, intent_id
from django_intents.rules.kinds import TASK_KIND
from django_intents.rules.states import TERMINAL
from django_intents.store.clock import server_now
from django_intents.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from django_intents.tasks.record import (
    STATUS,
    UNREADABLE,
    TaskRecord,
    load_task,
    make_result,
)
from django_intents.tasks.runner import run_task

if TYPE_CHECKING:
    from django_intents.managers import IntentManager
    from django_intents.models import Intent

OPTIONS = ("MAX_ATTEMPTS",)
# Django's task API: a task that raises has FAILED. Retries are opted into.
DEFAULT_MAX_ATTEMPTS = 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IntentsTask(Task):  # type: ignore[type-arg]
    """A task that may carry an idempotency key, the backend's ``task_class``.

    ``send_receipt.using(idempotency_key=f"order-{order.pk}").enqueue(order.pk)``
    stores the task once however many times it is enqueued with that key: the
    key becomes the intent's ``event_id``, so the intent id is the same. A key is
    scoped to its task function; without one, every enqueue is a new intent.
    """

    idempotency_key: str | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        idempotency_key: str | None = None,
    ) -> IntentsTask:
        # Explicit base call: zero-argument super() breaks in slotted dataclasses.
        changed: Task[Any, Any] = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        task = cast(IntentsTask, changed)  # dataclasses.replace keeps the class
        if idempotency_key is not None:
            task = dataclasses.replace(task, idempotency_key=idempotency_key)
        return task


class IntentsBackend(BaseTaskBackend):
    """Store tasks as intents; ``run_intent_workers`` runs them with leases and fencing.

    ``OPTIONS["MAX_ATTEMPTS"]`` is how many attempts a task that raises gets
    before it is ``FAILED``. The default, 1, is Django's semantics: the first
    exception fails the task. A larger number retries it with the intents
    backoff; ``None`` leaves the bound to ``INTENTS["MAX_ATTEMPTS"]``
    (unbounded unless set), as for any intent. ``INTENTS["MAX_ATTEMPTS"]``
    bounds every intent, so when both are numbers the smaller one applies.
    """

    task_class = IntentsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # Task.priority is the intent's priority (SPEC §11): the same range,
    # -100 to 100, and the same sense, higher first among due tasks.
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.max_attempts, self._option_errors = _parse_options(self.options)
        # The worker pool runs intents of the kinds in its handler registry.
        # Registering here covers every process that constructs this backend;
        # django_intents' AppConfig.ready() covers the worker pool, which never does.
        register_handler()

    def validate_task(self, task: Task[..., Any]) -> None:
        super().validate_task(task)
        key = getattr(task, "idempotency_key", None)
        if key is not None:
            try:
                check_text("idempotency_key", key, MAX_LENGTHS["event_id"])
            except ValueError as exc:
                raise InvalidTask(str(exc)) from None

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Store the task as a pending intent in the caller's transaction.

        With an idempotency key that is already stored, nothing is written and
        the stored task's result is returned, in whatever state it is.
        """
        self.validate_task(task)
        key: str | None = getattr(task, "idempotency_key", None)
        event_id = uuid.uuid4().hex if key is None else key
        id = intent_id(TASK_KIND, event_id, task.module_path)  # noqa: A001
        # TaskResult normalises the arguments: unsupported types raise Django's own error.
        result = self._new_result(task, id, args, kwargs)
        record = TaskRecord.of(task, result.args, result.kwargs, self.alias)
        manager = _intents()
        if key is not None:
            stored = manager.filter(pk=id).first()
            if stored is not None:
                return self._stored_result(stored, task, record)
        now = server_now(manager.db)
        payload = record.to_payload()
        manager.enqueue(
            TASK_KIND,
            event_id,
            task.module_path,
            payload,
            next_at=task.run_after,
            now=now,
            priority=task.priority,
        )
        object.__setattr__(result, "enqueued_at", now)  # TaskResult is frozen
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """Read the task's intent; ``TaskResultDoesNotExist`` if there is none (or no longer)."""
        stored = _intents().filter(pk=result_id, kind=TASK_KIND).first()
        if stored is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(stored)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        messages: list[CheckMessage] = list(super().check(**kwargs))
        messages += [
            Error(
                f"TASKS[{self.alias!r}]['OPTIONS']: {problem}",
                hint=f"IntentsBackend knows the options {', '.join(OPTIONS)}.",
                obj=f"TASKS[{self.alias!r}]",
                id="django_intents.E010",
            )
            for problem in self._option_errors
        ]
        if not apps.is_installed("django_intents"):
            messages.append(
                Error(
                    f"TASKS[{self.alias!r}] uses IntentsBackend, but django_intents is not "
                    "in INSTALLED_APPS",
                    hint="Add 'django_intents' to INSTALLED_APPS.",
                    obj=f"TASKS[{self.alias!r}]",
                    id="django_intents.E011",
                )
            )
        return messages

    # -- reading intents back ----------------------------------------------------

    def result_of(self, intent: Intent) -> TaskResult[Any, Any]:
        """The ``TaskResult`` of a task intent, as its row says now."""
        try:
            record = TaskRecord.from_payload(intent.payload)
            task = self.task_for(record)
        except UNREADABLE as exc:
            raise TaskResultDoesNotExist(f"{intent.id}: {exc}") from exc
        return self._result(intent, task, record)

    def task_for(self, record: TaskRecord) -> Task[Any, Any]:
        """The task a record names, with the options it was enqueued with.

        Raises ``InvalidTask`` when the path does not name a task (see ``load_task``)
        or the task's backend no longer accepts those options.
        """
        task = load_task(record.path).using(
            priority=record.priority,
            queue_name=record.queue_name,
            run_after=record.run_after,
            backend=record.backend,
        )
        if record.idempotency_key is not None and isinstance(task, IntentsTask):
            task = dataclasses.replace(task, idempotency_key=record.idempotency_key)
        return task

    def _result(
        self, intent: Intent, task: Task[Any, Any], record: TaskRecord
    ) -> TaskResult[Any, Any]:
        # A finished intent's last transition was its completion or cancellation.
        finished = intent.updated_at if intent.state in TERMINAL else None
        return make_result(task, intent, record, STATUS[intent.state], finished)

    def _new_result(
        self,
        task: Task[Any, Any],
        id: str,  # noqa: A002 - TaskResult names it
        args: Any,
        kwargs: Any,
    ) -> TaskResult[Any, Any]:
        return TaskResult(
            task=task,
            id=id,
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _stored_result(
        self, stored: Intent, task: Task[Any, Any], record: TaskRecord
    ) -> TaskResult[Any, Any]:
        """The result of a keyed task that was enqueued before.

        Its payload may be gone (compacted by retention); the row still holds
        the key, so the result is built from this call's task and arguments.
        """
        try:
            return self.result_of(stored)
        except TaskResultDoesNotExist:
            return self._result(stored, task, record)


def _intents() -> IntentManager:
    """The intent manager on the database enqueues go to (and results are read from).

    Looked up in the app registry, not imported: ``@task`` builds this backend
    when a tasks module is imported, which may be before the models are loaded.
    """
    intent = apps.get_model("django_intents", "Intent")
    return intent.objects.db_manager(router.db_for_write(intent))  # type: ignore[no-any-return]


def register_handler() -> None:
    """Register the task runner as the handler of ``TASK_KIND`` (idempotent)."""
    registry.register(TASK_KIND, run_task)


def _parse_options(options: Any) -> tuple[int | None, list[str]]:
    """``MAX_ATTEMPTS`` and the problems found; problems are reported by ``check()``.

    A bad value falls back to the default, so a misconfigured backend that
    runs anyway (checks silenced) fails tasks rather than retrying them forever.
    """
    if not isinstance(options, Mapping):
        return DEFAULT_MAX_ATTEMPTS, [f"must be a dict, not {type(options).__name__}"]
    problems = [f"unknown option {key!r}" for key in options if key not in OPTIONS]
    max_attempts = options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        problems.append(f"MAX_ATTEMPTS must be a positive integer or None, not {max_attempts!r}")
        max_attempts = DEFAULT_MAX_ATTEMPTS
    return max_attempts, problems
