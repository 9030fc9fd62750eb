"""One adapter per benchmarked system: how to enqueue, run workers and read results.

Each adapter runs inside a process set up with ``bench.settings`` for that
system, so it may import its own models. Everything is driven through the
system's public API and its own worker command, with the fastest settings its
documentation gives (persistent connections, the shortest poll interval we
also use, LISTEN/NOTIFY where it exists); only the large-table churn of the
peers is written as set-based SQL that moves rows through the same states
their workers would, because running 500,000 jobs through a peer's worker
would take most of an hour.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

# BENCH_PROFILE=<dir>: each worker process runs under py-spy, which writes its
# profile there (collapsed stacks, one file per process; docs/benchmarks.md).
_PROFILE = os.environ.get("BENCH_PROFILE")
_SPY = ["py-spy", "record", "--format", "raw", "--rate", "250", "--output"]
MANAGE = [sys.executable, "-m", "django"]


def manage(name: str) -> list[str]:
    """The command line of a Django command; under py-spy when ``BENCH_PROFILE`` is set."""
    if not _PROFILE:
        return [*MANAGE, name]
    out = os.path.join(_PROFILE, f"{name}-{os.getpid()}-{time.monotonic_ns()}.txt")
    return [
        os.path.join(os.path.dirname(sys.executable), _SPY[0]),
        *_SPY[1:],
        out,
        "--",
        *MANAGE,
        name,
    ]


POLL = "0.1"  # django-intents' default POLL_INTERVAL; the polled peers get the same


class System:
    name = ""
    label = ""
    vendors: tuple[str, ...] = ("sqlite", "postgresql", "mysql")
    has_batch = False
    batch_label = ""
    one_label = ""

    def tables(self) -> list[str]:
        raise NotImplementedError

    def enqueue_one(self, kind: str, key: str, n: int) -> None:
        raise NotImplementedError

    def enqueue_batch(self, kind: str, keys: Sequence[str]) -> None:
        raise NotImplementedError

    def fill(self, n: int, prefix: str = "noop") -> None:
        """Enqueue ``n`` no-op jobs as fast as the system allows (not timed)."""
        for start in range(0, n, 500):
            keys = [f"{prefix}-{i}" for i in range(start, min(start + 500, n))]
            if self.has_batch:
                self.enqueue_batch("noop", keys)
            else:
                with transaction.atomic():
                    for i, key in enumerate(keys):
                        self.enqueue_one("noop", key, start + i)

    def workers(self, count: int, *, drain: bool, lease: float | None = None) -> list[list[str]]:
        """Command lines of the worker processes for ``count`` concurrent workers."""
        raise NotImplementedError

    def finished(self) -> tuple[int, float | None]:
        """Count of jobs finished successfully, and the epoch time of the last one."""
        raise NotImplementedError

    def churn(self, n: int) -> None:
        """Leave ``n`` finished rows (90 % completed, 10 % cancelled/failed) behind."""
        raise NotImplementedError


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class Intents(System):
    name = "intents"
    label = "django-intents"
    has_batch = True
    one_label = "enqueue()"
    batch_label = "enqueue_many()"

    def tables(self) -> list[str]:
        from django_intents.models import Intent

        return [Intent._meta.db_table]

    def enqueue_one(self, kind: str, key: str, n: int) -> None:
        from django_intents.models import Intent

        Intent.objects.enqueue(f"bench.{kind}", key, "bench", {"n": n})

    def enqueue_batch(self, kind: str, keys: Sequence[str]) -> None:
        from django_intents.models import Intent

        Intent.objects.enqueue_many(
            [
                {"kind": f"bench.{kind}", "event_id": key, "target": "bench", "payload": {"n": i}}
                for i, key in enumerate(keys)
            ]
        )

    def workers(self, count: int, *, drain: bool, lease: float | None = None) -> list[list[str]]:
        argv = [*manage("run_intent_workers"), "--workers", str(count), "-v", "0"]
        if drain:
            argv += ["--drain", "--kinds", "bench.noop"]
        if lease is not None:
            argv += ["--lease", str(lease)]
        return [argv]

    def finished(self) -> tuple[int, float | None]:
        from django.db.models import Count, Max

        from django_intents.models import Intent

        row = Intent.objects.filter(state="completed").aggregate(
            n=Count("id"), last=Max("updated_at")
        )
        return row["n"], _epoch(row["last"])

    def churn(self, n: int) -> None:
        """Through the real claim and completion path, in large batches."""
        from django_intents.models import Intent

        manager = Intent.objects
        self.fill(n, prefix="churn")
        since = None  # as a pool does: each claim starts where the last one ended
        while claimed := manager.claim_many(5000, kinds=["bench.noop"], since=since):
            since = claimed[-1].next_at
            completing = claimed[: len(claimed) * 9 // 10]
            manager.complete_many([(i.id, i.claim_token) for i in completing])
            with transaction.atomic():
                for intent in claimed[len(completing) :]:
                    manager.cancel_claim(intent.id, intent.claim_token, "churn")


class _DjangoTasks(System):
    has_batch = False
    one_label = "task.enqueue()"

    def model(self) -> Any:
        raise NotImplementedError

    def clone_fill(self, n: int) -> None:
        """``n`` copies of one really enqueued no-op job, with fresh primary keys.

        Only for the rows the large-table workload churns: enqueueing 500,000
        jobs one call at a time would take minutes for a system without a
        batch API, and these rows are never timed.
        """
        model = self.model()
        self.enqueue_one("noop", "template", 0)
        template = model.objects.get()
        for start in range(0, n - 1, 5000):
            copies = []
            for _ in range(min(5000, n - 1 - start)):
                template.pk = uuid.uuid4()
                template._state.adding = True
                copies.append(copy.copy(template))
            model.objects.bulk_create(copies)

    def enqueue_one(self, kind: str, key: str, n: int) -> None:
        from .benchapp import djtasks

        if kind == "noop":
            djtasks.noop.enqueue(n=n)
        else:
            djtasks.stamp.enqueue(key=key)


class TasksDB(_DjangoTasks):
    name = "tasks_db"
    label = "django-tasks-db"

    def tables(self) -> list[str]:
        from django_tasks_db.models import DBTaskResult

        return [DBTaskResult._meta.db_table]

    def workers(self, count: int, *, drain: bool, lease: float | None = None) -> list[list[str]]:
        # db_worker runs one task at a time: N workers are N processes.
        argv = [*MANAGE, "db_worker", "--interval", POLL, "--no-startup-delay", "--no-reload"]
        argv += ["-v", "0"]
        if drain:
            argv.append("--batch")
        return [argv] * count

    def finished(self) -> tuple[int, float | None]:
        from django.db.models import Count, Max
        from django_tasks_db.models import DBTaskResult

        row = DBTaskResult.objects.filter(status="SUCCESSFUL").aggregate(
            n=Count("id"), last=Max("finished_at")
        )
        return row["n"], _epoch(row["last"])

    def model(self) -> Any:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult

    def churn(self, n: int) -> None:
        from django_tasks_db.models import DBTaskResult

        self.clone_fill(n)
        now = timezone.now()
        ids = list(DBTaskResult.objects.values_list("id", flat=True))
        DBTaskResult.objects.update(status="RUNNING", started_at=now)
        failed = ids[: len(ids) // 10]
        for start in range(0, len(failed), 5000):
            DBTaskResult.objects.filter(id__in=failed[start : start + 5000]).update(
                status="FAILED", finished_at=now
            )
        DBTaskResult.objects.filter(status="RUNNING").update(status="SUCCESSFUL", finished_at=now)


class Ox(_DjangoTasks):
    name = "ox"
    label = "django-ox"
    has_batch = True
    batch_label = "enqueue_many()"

    def tables(self) -> list[str]:
        from django_ox.models import OxTask

        return [OxTask._meta.db_table]

    def enqueue_batch(self, kind: str, keys: Sequence[str]) -> None:
        from django_ox.bulk import enqueue_many

        from .benchapp import djtasks

        if kind == "noop":
            enqueue_many(djtasks.noop, [((), {"n": i}) for i in range(len(keys))])
        else:
            enqueue_many(djtasks.stamp, [((), {"key": key}) for key in keys])

    def workers(self, count: int, *, drain: bool, lease: float | None = None) -> list[list[str]]:
        argv = [*MANAGE, "ox_worker", "--concurrency", str(count), "--interval", POLL, "-v", "0"]
        if drain:
            argv.append("--batch")
        return [argv]

    def finished(self) -> tuple[int, float | None]:
        from django.db.models import Count, Max
        from django_ox.models import OxTask

        row = OxTask.objects.filter(status="SUCCESSFUL").aggregate(
            n=Count("id"), last=Max("finished_at")
        )
        return row["n"], _epoch(row["last"])

    def model(self) -> Any:
        from django_ox.models import OxTask

        return OxTask

    def churn(self, n: int) -> None:
        from django.db.models import F
        from django_ox.models import OxTask

        self.clone_fill(n)
        now = timezone.now()
        ids = list(OxTask.objects.values_list("id", flat=True))
        OxTask.objects.update(
            status="RUNNING",
            started_at=now,
            locked_at=now,
            lease_expires_at=now,
            attempts=F("attempts") + 1,
        )
        failed = ids[: len(ids) // 10]
        for start in range(0, len(failed), 5000):
            OxTask.objects.filter(id__in=failed[start : start + 5000]).update(
                status="FAILED", finished_at=now, locked_at=None, lease_expires_at=None
            )
        OxTask.objects.filter(status="RUNNING").update(
            status="SUCCESSFUL", finished_at=now, locked_at=None, lease_expires_at=None
        )


class Procrastinate(System):
    name = "procrastinate"
    label = "Procrastinate"
    vendors = ("postgresql",)
    has_batch = True
    one_label = "defer()"
    batch_label = "batch_defer()"

    def tables(self) -> list[str]:
        return ["procrastinate_jobs", "procrastinate_events"]

    def enqueue_one(self, kind: str, key: str, n: int) -> None:
        from .benchapp import tasks

        if kind == "noop":
            tasks.noop.defer(n=n)
        else:
            tasks.stamp.defer(key=key)

    def enqueue_batch(self, kind: str, keys: Sequence[str]) -> None:
        from .benchapp import tasks

        if kind == "noop":
            tasks.noop.batch_defer(*({"n": i} for i in range(len(keys))))
        else:
            tasks.stamp.batch_defer(*({"key": key} for key in keys))

    def workers(self, count: int, *, drain: bool, lease: float | None = None) -> list[list[str]]:
        argv = [*MANAGE, "procrastinate", "worker", "--concurrency", str(count)]
        argv.append("--one-shot" if drain else "--wait")
        return [argv]

    def finished(self) -> tuple[int, float | None]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), max(e.at) FROM procrastinate_jobs j "
                "JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'succeeded' "
                "WHERE j.status = 'succeeded'"
            )
            count, last = cursor.fetchone()
        return count, _epoch(last)

    def churn(self, n: int) -> None:
        self.fill(n, prefix="churn")
        with connection.cursor() as cursor:
            # The status triggers record an event per change, as they do for a worker.
            cursor.execute("UPDATE procrastinate_jobs SET status = 'doing', attempts = 1")
            cursor.execute(
                "UPDATE procrastinate_jobs SET status = 'failed' "
                "WHERE id IN (SELECT id FROM procrastinate_jobs ORDER BY id LIMIT %s)",
                [n // 10],
            )
            cursor.execute(
                "UPDATE procrastinate_jobs SET status = 'succeeded' WHERE status = 'doing'"
            )


SYSTEMS: dict[str, type[System]] = {cls.name: cls for cls in (Intents, TasksDB, Ox, Procrastinate)}
PACKAGES = {"tasks_db": "django_tasks_db", "ox": "django_ox", "procrastinate": "procrastinate"}
