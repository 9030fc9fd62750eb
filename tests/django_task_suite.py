#!/usr/bin/env python3
"""Run Django's own task tests (``tests/tasks`` of the Django sdist) against IntentsBackend.

    python3 tests/django_task_suite.py --python .venv-django6/bin/python [--db sqlite]

Django's task API is specified by its tests as much as by its documentation.
This script gets the sdist of the Django 6.x that ``--python`` has installed
(``pip download --no-deps --no-binary :all:`` into ``.tmp/django-sdist/``,
once), extracts ``tests/tasks/`` and runs it with Django's test runner, with
Django's two built-in backends replaced by IntentsBackend in their modules, so
every ``TASKS`` setting and every ``isinstance`` in those tests gets ours:

- ``ImmediateBackend`` becomes ``ImmediateIntents``: ``enqueue`` stores the
  intent, then drains a one-thread ``WorkerPool`` (the same pool as
  ``run_intent_workers --drain``) and returns the stored result. The task
  runs in a worker thread on its own connection, through the claim, the
  runner and the fenced transitions, exactly as in production: these are the
  tests of what running a task means (statuses, errors and tracebacks,
  ``task_started``/``task_finished`` and Django's log lines, return values,
  context, async tasks).
- ``DummyBackend`` becomes ``DummyIntents``: ``enqueue`` stores the intent
  and nothing runs it, with the ``results``/``clear()`` the tests inspect,
  read from the intents table. These are the tests of enqueuing and reading
  results back (``get_result``, ``refresh``, validation, ``TaskResult``
  equality).

Which modules run: ``test_tasks``, ``test_immediate_backend`` and
``test_dummy_backend``. Not ``test_custom_backend``: it configures its own
backend classes and never touches ours. The tests in ``EXCLUDED`` are skipped
with their reason: each tests a property of the Immediate or Dummy backend
itself that IntentsBackend does not share on purpose (it stores results, so
``get_result`` works; it supports ``run_after``; it runs
tasks in a worker, never in the caller nor inside the enqueuing transaction;
its results live in the database, not in a list a test can edit), never how
a task's outcome reads through the API.

What the harness changes, because this backend's store is a database: the
SimpleTestCases, which refuse queries, may use the default (test) database;
a TransactionTestCase that limits ``available_apps`` keeps ``django_intents``;
async tests that call the sync API directly run with
``DJANGO_ALLOW_ASYNC_UNSAFE`` (an in-memory backend never notices) and close
the connections their event loop's thread opened.

Exit status: 0 when every test passed, 1 on any failure, 77 when the suite
could not be run here (no network for the first download, or no Django 6 in
``--python``), with the reason on the last line.
"""

from __future__ import annotations

import argparse
import copy
import functools
import inspect
import os
import shutil
import subprocess
import sys
import tarfile
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".tmp" / "django-sdist"
SKIPPED = 77  # the exit status automake and meson read as "skipped"
MODULES = ["tasks.test_tasks", "tasks.test_immediate_backend", "tasks.test_dummy_backend"]
EXCLUDED = {
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        "ImmediateBackend keeps no results; IntentsBackend stores them (get_result works)"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
        "ImmediateBackend keeps no results; IntentsBackend stores them (refresh works)"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "ImmediateBackend cannot defer; IntentsBackend supports run_after"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "ImmediateBackend runs the task in the caller, so KeyboardInterrupt reaches it; a "
        "worker records it as the task's failure and goes on"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTransactionTestCase"
    ".test_doesnt_wait_until_transaction_commit_by_default": (
        "the opposite of IntentsBackend's guarantee: a task enqueued in a transaction is "
        "stored with it and runs only once it commits"
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "edits DummyBackend's in-memory result list, which a database store does not have"
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": (
        "edits DummyBackend's in-memory result list, which a database store does not have"
    ),
}


# -- preparing: run by any Python 3 -----------------------------------------------


class Skip(Exception):
    """The suite cannot run here; the message says why."""


def django_version(python: str) -> str:
    probe = subprocess.run(
        [python, "-c", "import django; print(django.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode:
        raise Skip(f"{python} cannot import Django: {probe.stderr.strip().splitlines()[-1:]}")
    version = probe.stdout.strip()
    if int(version.split(".")[0]) < 6:
        raise Skip(f"{python} has Django {version}; django.tasks and its tests need Django 6")
    return version


def sdist(python: str, version: str) -> Path:
    """The Django sdist of ``version``, downloaded once into ``.tmp/django-sdist/``."""
    found = sorted(CACHE.glob(f"[dD]jango-{version}.tar.gz"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    download = [python, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    download += ["--no-deps", "--no-binary", ":all:", f"Django=={version}", "-d", str(CACHE)]
    print("$ " + " ".join(download), flush=True)
    done = subprocess.run(download, capture_output=True, text=True, check=False)
    found = sorted(CACHE.glob(f"[dD]jango-{version}.tar.gz"))
    if done.returncode or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Skip(f"could not download the Django {version} sdist: {last}")
    return found[0]


def django_tests(python: str, version: str) -> Path:
    """The directory holding Django's ``tasks`` test package, extracted once under ``.tmp/``."""
    target = ROOT / ".tmp" / "django-task-suite" / version
    if target.exists():
        return target
    archive = sdist(python, version)
    partial = target.with_name(f"{version}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/tests/tasks/" in m.name and m.isfile()]
        if not members:
            raise Skip(f"{archive.name} has no tests/tasks/")
        for member in members:
            relative = Path(member.name.split("/tests/tasks/", 1)[1])
            if relative.is_absolute() or ".." in relative.parts:
                raise Skip(f"{archive.name} has a suspicious member {member.name!r}")
            path = partial / "tasks" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            path.write_bytes(source.read())
    # Renamed when complete: an interrupted extraction is redone, not half used.
    partial.rename(target)
    return target


def prepare_and_run(python: str, vendor: str, verbosity: int) -> int:
    try:
        version = django_version(python)
        suite = django_tests(python, version)
    except Skip as why:
        print(f"django tests/tasks: skipped: {why}")
        return SKIPPED
    env = {**os.environ, "INTENTS_TEST_DB": vendor}
    command = [python, __file__, "--run", str(suite), "-v", str(verbosity)]
    return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode


# -- running: inside the Django 6 environment ------------------------------------


def configure() -> None:
    """Settings for Django's task tests: the intents test database, ``django_intents`` installed."""
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    from tests import settings as intents_settings

    databases = copy.deepcopy(intents_settings.DATABASES)
    test = databases["default"]["TEST"]
    # Not the pytest run's test database: the two may run side by side.
    stem, dot, suffix = test["NAME"].rpartition(".sqlite3")
    test["NAME"] = f"{stem}_tasksuite{dot}{suffix}" if dot else f"{suffix}_tasksuite"
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_intents"],
        TASKS={"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}},
        USE_TZ=True,
        SECRET_KEY="django-task-suite",  # noqa: S106
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            # The pool's own lines (retries, failures) would drown the test output.
            "loggers": {"django_intents": {"level": "CRITICAL"}},
        },
    )


def replace_builtin_backends() -> None:
    """Put IntentsBackend where Django's tests find the Immediate and Dummy backends."""
    import django
    from django.tasks.backends import dummy, immediate

    django.setup()
    from django_intents.models import Intent
    from django_intents.tasks import TASK_KIND, IntentsBackend
    from django_intents.tasks.runner import run_task
    from django_intents.worker.pool import WorkerPool

    class ImmediateIntents(IntentsBackend):
        """Store the task, then run it with a drained one-thread pool before returning."""

        def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
            result = super().enqueue(task, args, kwargs)
            pool = WorkerPool(
                handlers={TASK_KIND: run_task},
                workers=1,
                drain=True,
                poll_interval=0.01,
                handle_signals=False,
            )
            pool.run()
            return self.get_result(result.id)

    class DummyIntents(IntentsBackend):
        """Store the task and run nothing; ``results`` and ``clear()`` read the table."""

        def _mine(self) -> Any:
            return Intent.objects.filter(kind=TASK_KIND, payload__backend=self.alias)

        @property
        def results(self) -> list[Any]:
            return [self.result_of(i) for i in self._mine().order_by("created_at", "id")]

        def clear(self) -> None:
            self._mine().delete()

    immediate.ImmediateBackend = ImmediateIntents  # type: ignore[misc,assignment]
    dummy.DummyBackend = DummyIntents  # type: ignore[misc,assignment]


def tests_of(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    found: list[unittest.TestCase] = []
    for test in suite:
        found += tests_of(test) if isinstance(test, unittest.TestSuite) else [test]
    return found


def closing_connections(method: Callable[..., Any]) -> Callable[..., Any]:
    """Close the connections an async test opened in its event loop's thread.

    Nothing else would: that thread outlives the test, and PostgreSQL refuses
    to drop a test database that sessions are still connected to.
    """
    from django.db import connections

    @functools.wraps(method)
    async def test(self: Any) -> None:
        try:
            await method(self)
        finally:
            connections.close_all()

    return test


def run_suite(directory: Path, verbosity: int) -> int:
    # Some async tests call the sync API (``get_result``, ``results``) directly,
    # which an in-memory backend allows and a database one refuses in an event loop.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    configure()
    replace_builtin_backends()
    from django.test import SimpleTestCase, TransactionTestCase
    from django.test.runner import DiscoverRunner

    sys.path.insert(0, str(directory))
    runner = DiscoverRunner(verbosity=verbosity, interactive=False)
    runner.setup_test_environment()
    suite = runner.build_suite(MODULES)
    for test in tests_of(suite):
        cls, name = type(test), test._testMethodName
        method = getattr(cls, name)
        reason = EXCLUDED.get(test.id())
        if reason:
            setattr(cls, name, unittest.skip(reason)(method))
        elif inspect.iscoroutinefunction(method):
            setattr(cls, name, closing_connections(method))
    for cls in {type(test) for test in tests_of(suite)}:
        if issubclass(cls, TransactionTestCase):
            # The backend's store is the intents table: the app must stay available.
            if cls.available_apps is not None:
                cls.available_apps = [*cls.available_apps, "django_intents"]
        elif issubclass(cls, SimpleTestCase):
            cls.databases = {"default"}
    total = len(tests_of(suite))  # before the run, which empties the suite
    old = runner.setup_databases()
    try:
        result = runner.run_suite(suite)
    finally:
        runner.teardown_databases(old)
        runner.teardown_test_environment()
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    print(
        f"django tests/tasks against IntentsBackend: {total} tests, {total - skipped} ran, "
        f"{failed} failed, {skipped} skipped"
    )
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the Django 6 venv's python")
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgresql", "mysql"])
    parser.add_argument("-v", "--verbosity", type=int, default=1)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return run_suite(args.run, args.verbosity)
    return prepare_and_run(args.python, args.db, args.verbosity)


if __name__ == "__main__":
    sys.exit(main())
