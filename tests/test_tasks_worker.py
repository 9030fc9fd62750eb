"""End to end: enqueue through Django's task API, ``run_intent_workers --drain``, read results.

The worker is a real process (tests/workerutil.py) started on the test
database, exactly as an operator runs it; nothing registers the task handler
for it but ``django_intents``' own start-up, because ``TASKS`` names the backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_intents.models import Intent
from django_intents.tasks import TASK_KIND
from django_intents.tasks.compat import TaskResultStatus
from django_intents.tasks.runner import worker_id
from tests.testapp import tasks
from tests.testapp.models import Effect

from .conftest import row
from .workerutil import Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def drain(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``drain(*args, intents={...})`` runs ``run_intent_workers --drain`` and waits for it."""
    workers: list[Worker] = []

    def run(*args: str, intents: dict[str, Any] | None = None) -> Worker:
        worker = Worker(["--drain", *args], intents or {}, {})
        workers.append(worker)
        worker.assert_clean_exit(60)
        return worker

    yield run
    for worker in workers:
        worker.cleanup()


def test_tasks_round_trip_through_run_intent_workers(drain):
    added = tasks.add.enqueue(2, 3)
    awaited = tasks.async_add.enqueue(4, 5)
    echoed = tasks.echo.enqueue(1, (2, 3), key={"nested": [True, None]})
    emailed = tasks.send_email.enqueue("a@example.com")
    context = tasks.with_context.enqueue("ctx")

    worker = drain()

    assert f"kinds: {TASK_KIND} -> django_intents.tasks.runner.run_task" in worker.log
    assert tasks.add.get_result(added.id).return_value == 5
    assert tasks.async_add.get_result(awaited.id).return_value == 9
    assert tasks.echo.get_result(echoed.id).return_value == {
        "args": [1, [2, 3]],
        "kwargs": {"key": {"nested": [True, None]}},
    }
    assert tasks.send_email.get_result(emailed.id).return_value == "sent to a@example.com"
    result = tasks.with_context.get_result(context.id)
    assert result.return_value["id"] == context.id
    assert result.return_value["attempt"] == 1
    for enqueued in (added, awaited, echoed, emailed, context):
        result = tasks.add.get_backend().get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL
        (worker_id_,) = result.worker_ids
        assert worker_id_ != worker_id()  # another process ran it
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert row(enqueued.id).state == Intent.State.COMPLETED


def test_async_tasks_are_awaited_on_the_pools_event_loop_and_their_failures_recorded(drain):
    where = tasks.async_where.enqueue()
    fails = tasks.async_fails.enqueue()

    drain()

    result = tasks.async_where.get_result(where.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "intents-async")
    assert row(where.id).state == Intent.State.COMPLETED
    failed = tasks.async_fails.get_result(fails.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path == "builtins.ValueError"
    assert "async task failed" in failed.errors[0].traceback
    cancelled = row(fails.id)
    assert (cancelled.state, cancelled.attempts) == (Intent.State.CANCELLED, 1)
    assert cancelled.last_error == "ValueError: async task failed"


def test_a_task_that_exits_fails_and_the_worker_keeps_going(drain):
    # One worker thread, so the exiting tasks are claimed first and run before the rest.
    exiting = [tasks.exits.enqueue(1), tasks.calls_exit.enqueue(), tasks.interrupted.enqueue()]
    after = [tasks.record.enqueue(f"after {i}") for i in range(3)]

    worker = drain("--workers", "1", "--kinds", TASK_KIND)

    raised = (SystemExit, SystemExit, KeyboardInterrupt)
    for enqueued, exception in zip(exiting, raised, strict=True):
        result = tasks.exits.get_backend().get_result(enqueued.id)
        assert result.status == TaskResultStatus.FAILED, worker.log
        assert [error.exception_class for error in result.errors] == [exception]
        assert row(enqueued.id).state == Intent.State.CANCELLED
    for enqueued in after:
        assert tasks.record.get_result(enqueued.id).status == TaskResultStatus.SUCCESSFUL
    notes = sorted(Effect.objects.values_list("note", flat=True))
    assert notes == ["after 0", "after 1", "after 2"]


def test_an_exception_fails_the_task_at_once_and_it_never_runs_again(drain):
    enqueued = tasks.fail.enqueue("boom")

    drain()
    drain()  # a second pool finds nothing to do

    result = tasks.fail.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert "ValueError: boom" in result.errors[0].traceback
    intent = row(enqueued.id)
    assert (intent.state, intent.last_error, intent.attempts) == (
        "cancelled",
        "ValueError: boom",
        1,
    )


def test_a_return_value_json_cannot_hold_fails_once_and_for_all(drain):
    enqueued = tasks.returns_a_set.enqueue()

    drain()

    result = tasks.returns_a_set.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    assert row(enqueued.id).attempts == 1


def test_a_deferred_task_runs_once_its_time_has_come(drain):
    soon = timezone.now() + timedelta(seconds=2)
    enqueued = tasks.add.using(run_after=soon).enqueue(1, 1)

    drain()
    assert tasks.add.get_result(enqueued.id).status == TaskResultStatus.READY

    time.sleep(max((soon - timezone.now()).total_seconds(), 0) + 0.1)
    drain()

    result = tasks.add.get_result(enqueued.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert result.started_at >= soon


def test_a_keyed_task_enqueued_twice_runs_once(drain):
    keyed = tasks.record.using(idempotency_key="welcome-mail-42")
    first = keyed.enqueue("ran")
    keyed.enqueue("ran")

    drain()
    again = keyed.enqueue("ran")  # after it ran: still the same task, not a new one
    drain()

    assert again.id == first.id
    assert again.status == TaskResultStatus.SUCCESSFUL
    assert list(Effect.objects.values_list("note", flat=True)) == ["ran"]
    assert Intent.objects.filter(kind=TASK_KIND).count() == 1
