"""Running tasks: the worker pool in this process claims task intents and runs them.

``drain()`` runs a real ``WorkerPool`` with the handlers ``run_intent_workers``
would discover until nothing is due, so the outcome goes through the pool's own
fenced transitions. Rows must be committed for its threads to see them, hence
``transaction=True``. A few tests call ``run_task`` directly, where a test must
act between the claim and the run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_intents import Attempt, ClaimLost, Stop
from django_intents.handlers import discover
from django_intents.models import Intent
from django_intents.tasks import TASK_KIND
from django_intents.tasks.compat import TaskResultStatus, task_finished, task_started
from django_intents.tasks.runner import run_task, worker_id
from django_intents.worker.pool import WorkerPool
from tests.testapp import tasks
from tests.testapp.models import Effect

from .conftest import row

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_intents.tasks.IntentsBackend"
TASKS_LOGGER = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"


def drain() -> None:
    """Run every due task intent, as ``run_intent_workers --drain`` would, in this process."""
    pool = WorkerPool(
        handlers={TASK_KIND: discover()[TASK_KIND]},
        workers=2,
        drain=True,
        poll_interval=0.05,
        handle_signals=False,
    )
    assert pool.run() == 0


def claim() -> Intent:
    intent = Intent.objects.claim(kinds=[TASK_KIND])
    assert intent is not None
    return intent


@pytest.fixture
def sent() -> Iterator[list[tuple[str, Any, Any]]]:
    """Every ``task_started`` and ``task_finished`` as (signal, sender, task_result)."""
    received: list[tuple[str, Any, Any]] = []

    def on(name: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            received.append((name, sender, task_result))

        return receiver

    started, finished = on("started"), on("finished")
    task_started.connect(started, dispatch_uid="test_tasks_runner")
    task_finished.connect(finished, dispatch_uid="test_tasks_runner")
    yield received
    task_started.disconnect(dispatch_uid="test_tasks_runner")
    task_finished.disconnect(dispatch_uid="test_tasks_runner")


# -- success --------------------------------------------------------------------


def test_a_task_runs_and_its_result_reads_back():
    enqueued = tasks.add.enqueue(2, 3)

    drain()

    result = tasks.add.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.is_finished
    assert result.errors == []
    assert result.worker_ids == [worker_id()]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at <= timezone.now()
    intent = row(enqueued.id)
    assert (intent.state, intent.attempts, intent.last_error) == ("completed", 1, "")


def test_refresh_sees_the_task_finish():
    result = tasks.add.enqueue(2, 3)

    drain()
    result.refresh()

    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)


def test_the_command_drains_tasks_in_process_as_the_docs_show(monkeypatch):
    logger = logging.getLogger("django_intents")  # the command configures it
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    result = tasks.add.enqueue(20, 22)

    call_command("run_intent_workers", "--drain", "--kinds", "django.tasks")

    assert tasks.add.get_result(result.id).return_value == 42


def test_an_async_task_runs_in_the_worker():
    enqueued = tasks.async_add.enqueue(20, 22)

    drain()

    assert tasks.async_add.get_result(enqueued.id).return_value == 42


def test_a_task_that_takes_context_gets_its_running_result():
    enqueued = tasks.with_context.enqueue("hello")

    drain()

    value = tasks.with_context.get_result(enqueued.id).return_value
    assert value == {
        "label": "hello",
        "id": enqueued.id,
        "attempt": 1,
        "status": "RUNNING",
        "worker_ids": [worker_id()],
        "task": "tests.testapp.tasks.with_context",
    }


def test_return_values_are_normalised_as_django_normalises_them():
    enqueued = tasks.returns_a_tuple.enqueue()

    drain()

    assert tasks.returns_a_tuple.get_result(enqueued.id).return_value == [1, "two"]


def test_none_is_a_return_value_like_any_other():
    enqueued = tasks.record.enqueue("ran")

    drain()

    result = tasks.record.get_result(enqueued.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, None)
    assert "return_value" in row(enqueued.id).payload
    assert list(Effect.objects.values_list("note", flat=True)) == ["ran"]


def test_a_task_on_another_queue_runs_in_the_same_pool():
    enqueued = tasks.send_email.enqueue("a@example.com")

    drain()

    assert tasks.send_email.get_result(enqueued.id).return_value == "sent to a@example.com"


def test_a_deferred_task_is_not_run_before_its_time():
    later = tasks.add.using(run_after=timezone.now() + timezone.timedelta(hours=1)).enqueue(1, 1)

    drain()

    assert tasks.add.get_result(later.id).status == TaskResultStatus.READY
    assert row(later.id).attempts == 0


# -- failures -------------------------------------------------------------------------


def retrying(max_attempts: int | None) -> Any:
    """``TASKS`` with the default backend's ``OPTIONS["MAX_ATTEMPTS"]`` set: retries opted into."""
    options = {"MAX_ATTEMPTS": max_attempts}
    setting = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": options}}
    return override_settings(TASKS=setting)


def test_an_exception_fails_the_task_by_default_with_its_traceback():
    enqueued = tasks.fail.enqueue("boom")

    drain()

    result = tasks.fail.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "Traceback (most recent call last)" in error.traceback
    assert "raise ValueError(message)" in error.traceback
    assert error.traceback.rstrip().endswith("ValueError: boom")
    assert result.worker_ids == [worker_id()]
    assert result.finished_at == row(enqueued.id).updated_at
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    intent = row(enqueued.id)
    assert (intent.state, intent.last_error, intent.attempts) == (
        "cancelled",
        "ValueError: boom",
        1,
    )


def test_a_failed_task_is_final():
    enqueued = tasks.flaky.enqueue(succeed_on=2)
    drain()

    assert not Intent.objects.retry_now(enqueued.id)  # finished intents are not retried
    drain()

    result = tasks.flaky.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == row(enqueued.id).attempts == 1


@retrying(3)
def test_with_max_attempts_in_options_an_exception_is_retried_with_backoff():
    enqueued = tasks.fail.enqueue("boom")

    drain()

    result = tasks.fail.get_result(enqueued.id)
    assert result.status == TaskResultStatus.READY  # ready to be executed again
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert result.finished_at is None
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    intent = row(enqueued.id)
    assert (intent.state, intent.last_error) == ("pending", "ValueError: boom")
    assert intent.next_at > timezone.now()  # backoff


@retrying(3)
def test_a_retried_task_keeps_its_errors_and_can_still_succeed():
    enqueued = tasks.flaky.enqueue(succeed_on=2)
    drain()
    assert Intent.objects.retry_now(enqueued.id)  # skip the backoff

    drain()

    result = tasks.flaky.get_result(enqueued.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert [error.exception_class for error in result.errors] == [RuntimeError]
    assert result.worker_ids == [worker_id(), worker_id()]
    assert result.attempts == row(enqueued.id).attempts == 2
    assert result.started_at < result.last_attempted_at


@pytest.mark.parametrize(
    ("options", "intents"),
    [(2, {}), (None, {"MAX_ATTEMPTS": 2}), (5, {"MAX_ATTEMPTS": 2}), (2, {"MAX_ATTEMPTS": 5})],
    ids=["options", "intents-setting", "intents-smaller", "options-smaller"],
)
def test_the_smaller_max_attempts_fails_the_task_on_its_last_attempt(options, intents):
    with retrying(options), override_settings(INTENTS=intents):
        enqueued = tasks.fail.enqueue("again")
        drain()
        assert tasks.fail.get_result(enqueued.id).status == TaskResultStatus.READY
        assert Intent.objects.retry_now(enqueued.id)

        drain()

        result = tasks.fail.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at == row(enqueued.id).updated_at
    assert [error.exception_class for error in result.errors] == [ValueError, ValueError]
    intent = row(enqueued.id)
    assert (intent.state, intent.last_error, intent.attempts) == (
        "cancelled",
        "ValueError: again",
        2,
    )


def test_retries_belong_to_the_backend_alias_a_task_was_enqueued_with():
    setting = {
        "default": {"BACKEND": BACKEND},
        "retrying": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 3}},
    }
    with override_settings(TASKS=setting):
        once = tasks.fail.enqueue("once")
        again = tasks.fail.using(backend="retrying").enqueue("again")
        drain()

    assert (row(once.id).state, row(again.id).state) == ("cancelled", "pending")


def test_stop_fails_the_task_at_once_and_keeps_its_message():
    enqueued = tasks.stop.enqueue("no such customer")

    drain()

    result = tasks.stop.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [Stop]
    intent = row(enqueued.id)
    assert (intent.state, intent.last_error, intent.attempts) == (
        "cancelled",
        "no such customer",
        1,
    )


@pytest.mark.parametrize(
    ("task", "args", "exception", "last_error"),
    [
        (tasks.exits, (3,), SystemExit, "SystemExit: 3"),
        (tasks.exits, (0,), SystemExit, "SystemExit: 0"),
        (tasks.calls_exit, (), SystemExit, "SystemExit: None"),
        (tasks.interrupted, (), KeyboardInterrupt, "KeyboardInterrupt"),
    ],
)
def test_exit_or_interrupt_fails_the_task_and_the_worker_goes_on(task, args, exception, last_error):
    exiting = task.enqueue(*args)
    after = tasks.record.enqueue("after")

    drain()  # returns: the pool survived

    result = task.get_result(exiting.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [exception]
    intent = row(exiting.id)
    assert (intent.state, intent.last_error, intent.claim_token) == ("cancelled", last_error, "")
    assert tasks.record.get_result(after.id).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(
    ("task", "exception", "message"),
    [
        (tasks.returns_a_set, TypeError, "Unsupported type"),
        (tasks.returns_nan, ValueError, "the return value is nan"),
    ],
)
def test_a_return_value_json_cannot_hold_fails_the_task_without_retrying(task, exception, message):
    enqueued = task.enqueue()

    drain()

    result = task.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is exception
    assert message in error.traceback
    intent = row(enqueued.id)
    assert intent.state == "cancelled"  # never claimed again
    assert message in intent.last_error


# -- signals and logs ---------------------------------------------------------------


def test_started_and_finished_are_sent_for_a_successful_task(sent):
    from django_intents.tasks import IntentsBackend

    enqueued = tasks.add.enqueue(1, 2)

    drain()

    assert [(name, sender) for name, sender, _ in sent] == [
        ("started", IntentsBackend),
        ("finished", IntentsBackend),
    ]
    started, finished = sent[0][2], sent[1][2]
    assert (started.id, started.status, started.worker_ids) == (
        enqueued.id,
        TaskResultStatus.RUNNING,
        [worker_id()],
    )
    assert started.started_at is not None
    assert (finished.status, finished.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert finished.finished_at is not None


def test_finished_is_sent_once_with_failed_for_a_task_that_raises(sent):
    enqueued = tasks.fail.enqueue("boom")

    drain()

    assert [(name, result.status) for name, _, result in sent] == [
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]
    finished = sent[1][2]
    assert finished.id == enqueued.id
    assert finished.finished_at is not None
    assert [error.exception_class for error in finished.errors] == [ValueError]


@retrying(None)
def test_finished_tells_a_retry_from_a_failure(sent):
    tasks.fail.enqueue("retried")
    tasks.stop.enqueue("failed")

    drain()

    finished = {result.task.name: result for name, _, result in sent if name == "finished"}
    assert finished["fail"].status == TaskResultStatus.READY
    assert finished["fail"].finished_at is None
    assert finished["stop"].status == TaskResultStatus.FAILED
    assert finished["stop"].finished_at is not None
    assert [name for name, _, _ in sent].count("started") == 2


def test_djangos_task_logging_sees_start_success_and_failure_with_its_exception(caplog):
    ok = tasks.add.enqueue(1, 2)
    failed = tasks.stop.enqueue("nope")

    with caplog.at_level(logging.INFO, logger=TASKS_LOGGER):
        drain()

    messages = {record.getMessage(): record for record in caplog.records}
    assert f"Task id={ok.id} path=tests.testapp.tasks.add state=RUNNING" in messages
    assert f"Task id={ok.id} path=tests.testapp.tasks.add state=SUCCESSFUL" in messages
    failure = messages[f"Task id={failed.id} path=tests.testapp.tasks.stop state=FAILED"]
    assert failure.levelno == logging.ERROR
    assert failure.exc_info is not None
    assert failure.exc_info[0] is Stop


def test_a_failing_signal_receiver_is_logged_and_changes_no_outcome(caplog):
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_started.connect(broken, dispatch_uid="test_tasks_runner_broken")
    task_finished.connect(broken, dispatch_uid="test_tasks_runner_broken")
    try:
        ok = tasks.add.enqueue(1, 2)
        stopped = tasks.stop.enqueue("gone")
        with caplog.at_level(logging.ERROR, logger="django_intents.tasks"):
            drain()
    finally:
        task_started.disconnect(dispatch_uid="test_tasks_runner_broken")
        task_finished.disconnect(dispatch_uid="test_tasks_runner_broken")

    assert tasks.add.get_result(ok.id).return_value == 3
    assert row(stopped.id).state == "cancelled"  # not retried because a receiver failed
    failures = [r for r in caplog.records if "signal receiver" in r.getMessage()]
    assert len(failures) == 4  # started and finished, for each task
    assert all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)


# -- what never runs ---------------------------------------------------------------------


def stored_path_intent(path: str) -> str:
    """A task intent whose payload names ``path``: what an edited or forged row looks like."""
    enqueued = tasks.record.enqueue("forged")
    payload = {**row(enqueued.id).payload, "task": path}
    Intent.objects.filter(pk=enqueued.id).update(payload=payload)
    return enqueued.id


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.testapp.tasks.not_a_task", "is not a task"),
        ("os.system", "is not a task"),
        ("tests.testapp.tasks.alias_of_add", "under another name"),
        ("tests.testapp.tasks.removed", "cannot import"),
        ("no_such_module.task", "cannot import"),
    ],
)
def test_a_stored_path_that_does_not_name_a_task_never_runs(path, message):
    id = stored_path_intent(path)  # noqa: A001

    drain()

    intent = row(id)
    assert intent.state == "cancelled"
    assert intent.last_error.startswith("cannot run this task: ")
    assert message in intent.last_error
    assert not Effect.objects.exists()


def test_a_payload_that_is_not_a_task_record_is_cancelled():
    id = Intent.objects.enqueue(TASK_KIND, "e", "tests.testapp.tasks.record", {"task": 1})  # noqa: A001

    drain()

    intent = row(id)
    assert intent.state == "cancelled"
    assert "not a task record" in intent.last_error
    assert not Effect.objects.exists()


def test_a_task_whose_queue_is_no_longer_configured_is_cancelled():
    enqueued = tasks.send_email.enqueue("a@example.com")
    setting = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}

    with override_settings(TASKS=setting):
        drain()

    intent = row(enqueued.id)
    assert intent.state == "cancelled"
    assert "Queue 'emails' is not valid" in intent.last_error


def test_a_task_whose_backend_alias_is_gone_is_cancelled():
    enqueued = tasks.add.enqueue(1, 2)
    setting = {"renamed": {"BACKEND": BACKEND}}

    with override_settings(TASKS=setting):
        drain()

    intent = row(enqueued.id)
    assert intent.state == "cancelled"
    assert "cannot run this task" in intent.last_error
    assert "'default'" in intent.last_error


# -- fencing (run_task called directly) ------------------------------------------------


def test_a_lost_claim_before_the_start_runs_nothing_and_writes_nothing():
    enqueued = tasks.record.enqueue("too late")
    intent = claim()
    assert Intent.objects.retry_now(intent.id)  # an administrator takes it back
    before = row(intent.id).payload

    with pytest.raises(ClaimLost):
        run_task(intent, Attempt(intent))

    assert not Effect.objects.exists()
    assert row(enqueued.id).payload == before


def test_a_claim_lost_while_the_task_runs_drops_its_return_value():
    enqueued = tasks.fenced_midway.enqueue()
    intent = claim()

    with pytest.raises(ClaimLost):
        run_task(intent, Attempt(intent))

    fresh = row(enqueued.id)
    assert (fresh.state, fresh.claim_token) == ("pending", "")
    assert "return_value" not in fresh.payload
    assert fresh.payload["worker_ids"] == [worker_id()]  # the start was recorded
    assert tasks.fenced_midway.get_result(enqueued.id).status == TaskResultStatus.READY


def test_a_pool_shutting_down_does_not_start_a_claimed_task():
    tasks.record.enqueue("never")
    intent = claim()
    attempt = Attempt(intent)
    attempt.cancelled.set()

    with pytest.raises(ClaimLost):
        run_task(intent, attempt)

    assert not Effect.objects.exists()
    assert row(intent.id).payload["worker_ids"] == []
