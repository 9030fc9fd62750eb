"""A rolling deploy: workers of the previous release keep working while this
release's migrations run, and after (docs/operations.md, "Upgrades").

The previous release's code comes from git history, as a deploy would have
it on the hosts not yet upgraded. The database starts at its schema
(migration 0004); an old worker runs; this release's migrations apply under
it (on PostgreSQL up to 0017: 0018 is applied with the old release stopped,
after which it can work but not enqueue); then both releases work, on the
same table, and every intent runs exactly once.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from django_intents.models import Intent

from .conftest import external_kinds
from .workerutil import ROOT, Worker, wait_for

# 0.1.0: the commit that dated it in CHANGELOG.md, with migrations up to 0004.
PREVIOUS_RELEASE = "ca738d819abaa6b7cebd9389f76c37184f74d7f1"
PREVIOUS_SCHEMA = "0004"
KIND = "upgrade.ok"
# PostgreSQL's 0018 makes the table partitioned: the previous release cannot
# enqueue past it, so the old worker is stopped for it (docs/deployment.md).
PAST_THE_STOP = ["0017"] if connection.vendor == "postgresql" else []

pytestmark = pytest.mark.skipif(
    connection.vendor not in ("sqlite", "postgresql", "mysql"), reason="the three databases"
)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the previous release's ``django_intents``."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "django_intents"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = f"the previous release's code comes from git history ({PREVIOUS_RELEASE[:7]})"
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: {detail!r}; CI is set, so this is a failure, not a skip")
        pytest.skip(f"{reason}, which this checkout lacks")
    where = tmp_path_factory.mktemp("release-0.1.0")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where


class Previous:
    """Processes that import the previous release: it comes first on ``sys.path``."""

    def __init__(self, code: Path) -> None:
        self.code = code
        self.env = {
            "DJANGO_SETTINGS_MODULE": "tests.upgrade_settings",
            "PYTHONPATH": str(ROOT),  # for tests.*; the cwd, first, holds the old package
        }

    def worker(self) -> Worker:
        return Worker(
            ["--workers", "2", "--lease", "5", "--renew", "1"], {}, self.env, cwd=self.code
        )

    def enqueue(self, prefix: str, n: int) -> None:
        script = (
            "import django; django.setup()\n"
            "import django_intents, sys\n"
            f"assert django_intents.__file__.startswith({str(self.code)!r}), django_intents.__file__\n"
            "from django_intents.models import Intent\n"
            f"for i in range({n}): Intent.objects.enqueue({KIND!r}, f'{prefix}-{{i}}', 't')\n"
        )
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=self.code,
            env={**os.environ, **self.env},
            check=True,
            capture_output=True,
            timeout=60,
        )


def completed(prefix: str) -> int:
    return Intent.objects.filter(event_id__startswith=f"{prefix}-", state="completed").count()


@pytest.mark.django_db(transaction=True)
def test_previous_release_workers_keep_working_through_the_migrations_and_after(
    previous_release,
):
    previous = Previous(previous_release)
    workers: list[Worker] = []
    call_command("migrate", "django_intents", PREVIOUS_SCHEMA, verbosity=0)
    try:
        previous.enqueue("before", 20)
        old = previous.worker()
        workers.append(old)
        wait_for(lambda: completed("before") == 20, "the old worker on the old schema")

        previous.enqueue("during", 20)
        # Under the running old worker: every migration but PostgreSQL's 0018.
        call_command("migrate", "django_intents", *PAST_THE_STOP, verbosity=0)
        wait_for(lambda: completed("during") == 20, "the old worker across the migrations")
        if PAST_THE_STOP:
            # 0018 is the one step at which the releases must not run side by side
            # (docs/deployment.md): stop, migrate; the old release can then no
            # longer enqueue, and says so writing nothing, but its worker still works.
            old.signal(signal.SIGTERM)
            old.assert_clean_exit(timeout=15)
            call_command("migrate", "django_intents", verbosity=0)
            with pytest.raises(subprocess.CalledProcessError) as refused:
                previous.enqueue("refused", 1)
            assert b"ON CONFLICT" in refused.value.stderr
            assert not Intent.objects.filter(event_id__startswith="refused-").exists()
            old = previous.worker()
            workers.append(old)

        # After: this release enqueues with its new fields, the old one without them,
        # and a worker of each release shares the table.
        handlers = {"HANDLERS": {KIND: "tests.upgradeapp.work.ok"}}
        new = Worker(
            ["--workers", "2", "--lease", "5", "--renew", "1", "--kinds", KIND], handlers, {}
        )
        workers.append(new)
        # Signals are handled from the start line on: before it, SIGTERM kills outright.
        wait_for(new.started, "this release's worker to start", timeout=30)
        with external_kinds(KIND):
            for i in range(20):
                Intent.objects.enqueue(KIND, f"after-new-{i}", "t", priority=i % 3 - 1)
        old_after = 0 if PAST_THE_STOP else 20
        if old_after:
            previous.enqueue("after-old", old_after)
        with external_kinds(KIND):  # taken by the old worker too, while it runs
            for i in range(20):
                Intent.objects.enqueue(KIND, f"after-both-{i}", "t")
        wait_for(
            lambda: (
                completed("after-new") == 20
                and completed("after-old") == old_after
                and completed("after-both") == 20
            ),
            "both releases' workers' intents after the migrations",
            timeout=30,
        )
        for worker in (old, new):
            worker.signal(signal.SIGTERM)
            worker.assert_clean_exit(timeout=15)
            assert "Traceback" not in worker.log, worker.log
    finally:
        for worker in workers:
            worker.cleanup()
        call_command("migrate", "django_intents", verbosity=0)

    rows = Intent.objects.filter(kind=KIND)
    assert rows.count() == (80 if PAST_THE_STOP else 100)
    assert set(rows.values_list("state", "attempts")) == {("completed", 1)}
