"""IntentsBackend on the enqueue side: Django's task API in, intents out, results read back.

These run in the test's transaction; nothing here runs a task. Running them is
in test_tasks_runner.py (the pool in this process) and test_tasks_worker.py
(``run_intent_workers --drain`` as a real process). Task functions are in
tests/testapp/tasks.py, decorated with the ``@task`` of the installed Django.
"""

from __future__ import annotations

import dataclasses
import decimal
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.checks import Error
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_intents import intent_id
from django_intents.handlers import discover
from django_intents.models import Intent
from django_intents.store.clock import server_now
from django_intents.tasks import TASK_KIND, IntentsBackend, IntentsTask
from django_intents.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_intents.tasks.runner import run_task
from tests.testapp import tasks

from .conftest import row

try:
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:  # Django 5.2: the backport
    from django_tasks.exceptions import TaskResultMismatch  # type: ignore[no-redef]

pytestmark = pytest.mark.django_db

BACKEND = "django_intents.tasks.IntentsBackend"
# Where Django's own receivers log task events.
TASKS_LOGGER = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"


@pytest.fixture
def enqueued() -> Any:
    """Every ``task_enqueued`` signal sent while the test runs, as (sender, task_result)."""
    sent: list[tuple[Any, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append((sender, task_result))

    task_enqueued.connect(receiver, dispatch_uid="test_tasks_backend")
    yield sent
    task_enqueued.disconnect(dispatch_uid="test_tasks_backend")


def task_intents() -> list[Intent]:
    return list(Intent.objects.filter(kind=TASK_KIND))


# -- enqueue -----------------------------------------------------------------


def test_enqueue_stores_one_pending_intent_naming_the_task():
    result = tasks.add.enqueue(1, 2)

    (intent,) = task_intents()
    assert intent.id == result.id
    assert intent.state == Intent.State.PENDING
    assert intent.target == "tests.testapp.tasks.add"
    assert intent.next_at == intent.created_at == result.enqueued_at
    assert intent.payload["task"] == "tests.testapp.tasks.add"
    assert (intent.payload["args"], intent.payload["kwargs"]) == ([1, 2], {})
    assert (intent.payload["backend"], intent.payload["queue_name"]) == ("default", "default")
    assert intent.payload["worker_ids"] == []
    assert intent.payload["errors"] == []
    assert "return_value" not in intent.payload


def test_enqueue_returns_a_ready_result_like_any_django_backend():
    before = server_now()
    result = tasks.echo.enqueue(1, "two", three=[3])

    assert result.task == tasks.echo
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    assert (result.args, result.kwargs) == ([1, "two"], {"three": [3]})
    assert before <= result.enqueued_at <= timezone.now()
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018


def test_without_a_key_every_enqueue_is_a_new_intent():
    first, second = tasks.add.enqueue(1, 2), tasks.add.enqueue(1, 2)

    assert first.id != second.id
    assert len(task_intents()) == 2


def test_task_enqueued_is_sent_with_the_result_and_logged_by_django(enqueued, caplog):
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        result = tasks.add.enqueue(1, 2)

    assert enqueued == [(IntentsBackend, result)]
    assert f"Task id={result.id} path=tests.testapp.tasks.add enqueued" in caplog.text


def test_enqueue_is_part_of_the_callers_transaction_and_a_rollback_leaves_nothing():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert row(result.id).state == Intent.State.PENDING  # visible inside
        raise Abort

    assert task_intents() == []
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_aenqueue_stores_the_task_like_enqueue():
    result = async_to_sync(tasks.add.aenqueue)(2, 3)

    assert result.status == TaskResultStatus.READY
    assert tasks.add.get_result(result.id).args == [2, 3]


# -- arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [object(), datetime(2026, 1, 1, tzinfo=UTC), decimal.Decimal("1.5"), {1, 2}]
)
def test_unsupported_argument_types_are_refused_with_djangos_error(value):
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.echo.enqueue(value)
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.echo.enqueue(key=value)

    assert task_intents() == []


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((float("nan"),), {}, ValueError, r"args\[0\] is nan"),
        ((), {"x": float("inf")}, ValueError, r"kwargs\['x'\] is inf"),
        (({1: "one"},), {}, TypeError, "JSON object keys must be strings"),
        (("a\x00b",), {}, ValueError, "NUL"),
        (("\ud800",), {}, ValueError, "surrogate"),
    ],
)
def test_arguments_a_json_column_would_change_are_refused(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        tasks.echo.enqueue(*args, **kwargs)

    assert task_intents() == []


def test_arguments_are_normalised_as_django_normalises_them():
    result = tasks.echo.enqueue((1, 2), b"bytes", nested={"t": (3,)})

    assert result.args == [[1, 2], "bytes"]
    assert result.kwargs == {"nested": {"t": [3]}}
    assert tasks.echo.get_result(result.id).args == [[1, 2], "bytes"]


# -- validation (Django's, and this backend's choices) --------------------------


def test_run_after_defers_the_intent():
    later = timezone.now() + timedelta(hours=1)

    result = tasks.add.using(run_after=later).enqueue(1, 2)

    assert row(result.id).next_at == later
    assert tasks.add.get_result(result.id).task.run_after == later


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=datetime(2026, 1, 1))  # noqa: DTZ001


def test_task_priority_is_the_intent_priority_and_the_higher_is_claimed_first():
    assert IntentsBackend.supports_priority is True
    low = tasks.add.using(priority=-100).enqueue(1, 2)
    plain = tasks.add.enqueue(3, 4)
    high = tasks.add.using(priority=100).enqueue(5, 6)
    assert [row(r.id).priority for r in (low, plain, high)] == [-100, 0, 100]
    claimed = [Intent.objects.claim(now=timezone.now()).id for _ in range(3)]
    assert claimed == [high.id, plain.id, low.id]


def test_task_priority_out_of_range_is_refused_by_django_and_nothing_is_written():
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    assert not Intent.objects.exists()


def test_the_backend_supports_what_it_says():
    backend = task_backends["default"]
    assert isinstance(backend, IntentsBackend)
    assert (backend.supports_defer, backend.supports_async_task) == (True, True)
    assert backend.supports_get_result is True


def test_a_configured_queue_is_accepted_and_recorded_and_others_are_refused():
    result = tasks.send_email.enqueue("a@example.com")

    assert row(result.id).payload["queue_name"] == "emails"
    assert tasks.send_email.get_result(result.id).task.queue_name == "emails"
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        tasks.add.using(queue_name="nope")


def test_a_function_not_defined_at_module_level_is_refused():
    def local(x: int) -> int:
        return x

    with pytest.raises(InvalidTask, match="module level"):
        tasks.task(local)


# -- idempotency key -----------------------------------------------------------------


def test_the_same_idempotency_key_stores_the_task_once(enqueued):
    keyed = tasks.add.using(idempotency_key="order-7-total")

    first = keyed.enqueue(1, 2)
    second = keyed.enqueue(1, 2)

    assert first.id == second.id == intent_id(TASK_KIND, "order-7-total", "tests.testapp.tasks.add")
    assert len(task_intents()) == 1
    assert [result.id for _, result in enqueued] == [first.id]  # the second enqueued nothing
    assert second.status == TaskResultStatus.READY


def test_a_duplicate_key_returns_the_stored_task_the_first_enqueue_wins():
    keyed = tasks.echo.using(idempotency_key="k")
    first = keyed.enqueue("first")

    second = keyed.enqueue("second")

    assert second.id == first.id
    assert second.args == ["first"]
    assert row(first.id).payload["args"] == ["first"]


def test_arguments_are_checked_even_when_the_key_is_already_stored():
    keyed = tasks.echo.using(idempotency_key="k")
    keyed.enqueue(1)

    with pytest.raises(TypeError, match="Unsupported type"):
        keyed.enqueue(object())


def test_a_key_is_scoped_to_its_task_function():
    add = tasks.add.using(idempotency_key="k").enqueue(1, 2)
    echo = tasks.echo.using(idempotency_key="k").enqueue(1, 2)

    assert add.id != echo.id
    assert len(task_intents()) == 2


def test_a_keyed_task_that_finished_is_returned_in_its_final_state():
    keyed = tasks.add.using(idempotency_key="done-once")
    first = keyed.enqueue(1, 2)
    intent = row(first.id)
    payload = {**intent.payload, "return_value": 3}
    Intent.objects.filter(pk=first.id).update(state="completed", payload=payload)

    again = keyed.enqueue(1, 2)

    assert again.status == TaskResultStatus.SUCCESSFUL
    assert again.return_value == 3
    assert len(task_intents()) == 1


def test_a_keyed_task_whose_payload_was_compacted_is_still_stored_once():
    keyed = tasks.add.using(idempotency_key="compacted")
    first = keyed.enqueue(1, 2)
    Intent.objects.filter(pk=first.id).update(state="completed", payload=None)

    again = keyed.enqueue(1, 2)

    assert (again.id, again.status, again.args) == (first.id, TaskResultStatus.SUCCESSFUL, [1, 2])
    assert len(task_intents()) == 1


def test_the_key_survives_using_and_reads_back_with_the_task():
    task = tasks.add.using(idempotency_key="kept").using(run_after=timezone.now())

    assert isinstance(task, IntentsTask)
    assert task.idempotency_key == "kept"
    result = task.enqueue(1, 2)
    assert tasks.add.get_result(result.id).task.idempotency_key == "kept"
    assert row(result.id).event_id == "kept"


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "must not be empty"), ("a\x00b", "NUL"), ("k" * 256, "limit is 255"), (7, "string")],
)
def test_an_invalid_idempotency_key_is_refused(key, message):
    with pytest.raises(InvalidTask, match=f"idempotency_key.*{message}"):
        tasks.add.using(idempotency_key=key)


# -- get_result ----------------------------------------------------------------------


def test_get_result_reads_the_stored_task_back():
    enqueued = tasks.echo.using(queue_name="emails").enqueue(1, x=[2])

    result = task_backends["default"].get_result(enqueued.id)

    assert result.id == enqueued.id
    assert result.task == tasks.echo.using(queue_name="emails")
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([1], {"x": [2]})
    assert result.enqueued_at == enqueued.enqueued_at
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert (result.backend, result.errors, result.worker_ids) == ("default", [], [])


def test_task_get_result_and_aget_result_find_the_task():
    enqueued = tasks.add.enqueue(1, 2)

    assert tasks.add.get_result(enqueued.id).id == enqueued.id
    assert async_to_sync(tasks.add.aget_result)(enqueued.id).id == enqueued.id
    assert async_to_sync(task_backends["default"].aget_result)(enqueued.id).id == enqueued.id


def test_get_result_of_another_tasks_id_is_a_mismatch():
    enqueued = tasks.add.enqueue(1, 2)

    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(enqueued.id)


def test_an_unknown_id_or_an_intent_of_another_kind_does_not_exist():
    other = Intent.objects.enqueue("webhook", "e", "https://example.com", None)

    for missing in ("0" * 64, other, "not-even-an-id"):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(missing)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(tasks.add.aget_result)("0" * 64)


def test_a_result_compacted_by_retention_does_not_exist_any_more():
    enqueued = tasks.add.enqueue(1, 2)
    Intent.objects.filter(pk=enqueued.id).update(state="completed", payload=None)

    with pytest.raises(TaskResultDoesNotExist, match="not a task record"):
        tasks.add.get_result(enqueued.id)


def test_a_result_whose_task_function_is_gone_does_not_exist_naming_the_path():
    enqueued = tasks.add.enqueue(1, 2)
    payload = {**row(enqueued.id).payload, "task": "tests.testapp.tasks.removed"}
    Intent.objects.filter(pk=enqueued.id).update(payload=payload)

    with pytest.raises(TaskResultDoesNotExist, match="tests.testapp.tasks.removed"):
        task_backends["default"].get_result(enqueued.id)


@pytest.mark.parametrize(
    ("state", "status", "finished"),
    [
        ("pending", TaskResultStatus.READY, False),
        ("running", TaskResultStatus.RUNNING, False),
        ("completed", TaskResultStatus.SUCCESSFUL, True),
        ("cancelled", TaskResultStatus.FAILED, True),
    ],
)
def test_the_status_follows_the_intent_state(state, status, finished):
    enqueued = tasks.add.enqueue(1, 2)
    done_at = timezone.now() + timedelta(seconds=5)
    extra = {"claim_token": "t" * 32, "claim_until": done_at} if state == "running" else {}
    Intent.objects.filter(pk=enqueued.id).update(state=state, updated_at=done_at, **extra)

    result = tasks.add.get_result(enqueued.id)

    assert result.status == status
    assert result.is_finished is finished
    assert result.finished_at == (done_at if finished else None)


def test_refresh_reloads_the_result_from_the_intent():
    result = tasks.add.enqueue(1, 2)
    payload = {**row(result.id).payload, "return_value": 3, "worker_ids": ["w:1"]}
    Intent.objects.filter(pk=result.id).update(state="completed", payload=payload)

    result.refresh()

    assert (result.status, result.return_value, result.worker_ids) == (
        TaskResultStatus.SUCCESSFUL,
        3,
        ["w:1"],
    )
    assert result.attempts == 1


def test_arefresh_reloads_the_result_too():
    result = tasks.add.enqueue(1, 2)
    Intent.objects.filter(pk=result.id).update(state="cancelled")

    async_to_sync(result.arefresh)()

    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at == row(result.id).updated_at


# -- configuration -----------------------------------------------------------------


def test_the_task_runner_is_the_handler_of_the_task_kind():
    assert discover()[TASK_KIND] is run_task


def test_without_options_the_first_exception_fails_a_task():
    assert IntentsBackend("plain", {"BACKEND": BACKEND}).max_attempts == 1


@pytest.mark.parametrize("max_attempts", [1, 3, None])
def test_valid_options_pass_the_checks(max_attempts):
    options = {"MAX_ATTEMPTS": max_attempts}
    backend = IntentsBackend("strict", {"BACKEND": BACKEND, "OPTIONS": options})

    assert backend.max_attempts == max_attempts
    assert backend.check() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS must be a positive integer or None, not 0"),
        ({"MAX_ATTEMPTS": "3"}, "MAX_ATTEMPTS must be a positive integer or None, not '3'"),
        ({"MAX_ATTEMPS": 3}, "unknown option 'MAX_ATTEMPS'"),
        (["MAX_ATTEMPTS"], "must be a dict, not list"),
    ],
)
def test_bad_options_are_a_system_check_error_naming_them(options, message):
    backend = IntentsBackend("strict", {"BACKEND": BACKEND, "OPTIONS": options})

    assert backend.max_attempts == 1  # if it runs anyway, it does not retry forever
    (error,) = backend.check()
    assert isinstance(error, Error)
    assert error.id == "django_intents.E010"
    assert message in error.msg
    assert "TASKS['strict']" in error.msg


def test_options_reach_the_backend_through_the_tasks_setting():
    setting = {"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 5}}}
    with override_settings(TASKS=setting):
        assert task_backends["default"].max_attempts == 5
    assert task_backends["default"].max_attempts == 1


def test_the_task_class_is_a_django_task_with_one_more_field():
    fields = {field.name for field in dataclasses.fields(IntentsTask)}

    assert isinstance(tasks.add, IntentsTask)
    assert {"func", "priority", "backend", "queue_name", "run_after", "takes_context"} < fields
    assert "idempotency_key" in fields
