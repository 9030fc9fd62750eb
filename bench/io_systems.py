"""How each system runs the io workload: enqueue, worker command, and final states.

Kept apart from ``bench/systems.py`` because the io workload asks different
things of a system: jobs that wait and may fail, a worker setting meant for
waiting (threads, or attempts in flight on an event loop), and the count of
jobs in each final state rather than of successes only. Each peer runs the
variants it has a documented way to run well; docs/benchmarks.md cites the
documentation each setting comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from .systems import MANAGE, POLL


@dataclass(frozen=True)
class Variant:
    """One row of the io table: sync or async, timer or HTTP, succeeding or failing."""

    style: str  # "sync" (threads) or "async" (coroutines on an event loop)
    mode: str  # "sleep" or "http"
    fail: bool

    @property
    def name(self) -> str:
        handler = {
            ("sync", "sleep"): "time.sleep",
            ("async", "sleep"): "asyncio.sleep",
            ("sync", "http"): "urllib3",
            ("async", "http"): "aiohttp",
        }[(self.style, self.mode)]
        return handler + (", fails" if self.fail else "")


Workers = tuple[list[list[str]], str, int]

VARIANTS = [
    Variant(style, mode, fail)
    for fail in (False, True)
    for mode in ("sleep", "http")
    for style in ("sync", "async")
]


class IOSystem:
    """The io adapter of one system; ``styles`` are the variants it runs."""

    styles: tuple[str, ...] = ()

    def fill(self, n: int, variant: Variant) -> None:
        raise NotImplementedError

    def workers(self, variant: Variant, sizes: dict[str, int]) -> Workers:
        """Command lines of the worker processes, the setting as the table shows it,
        and how many jobs they may run at once in all."""
        raise NotImplementedError

    def states(self, variant: Variant) -> tuple[int, int, float | None]:
        """Jobs in the expected final state, jobs in another final state, last finish."""
        raise NotImplementedError


class Intents(IOSystem):
    styles = ("sync", "async")
    kinds = {
        ("sync", "sleep"): "bench.io.sleep",
        ("sync", "http"): "bench.io.http",
        ("async", "sleep"): "bench.io.asleep",
        ("async", "http"): "bench.io.ahttp",
    }

    def fill(self, n: int, variant: Variant) -> None:
        from django_intents.models import Intent

        kind = self.kinds[(variant.style, variant.mode)]
        for start in range(0, n, 500):
            Intent.objects.enqueue_many(
                [
                    {"kind": kind, "event_id": f"io-{i}", "target": "bench"}
                    | {"payload": {"fail": variant.fail}}
                    for i in range(start, min(start + 500, n))
                ]
            )

    def workers(self, variant: Variant, sizes: dict[str, int]) -> Workers:
        kind = self.kinds[(variant.style, variant.mode)]
        argv = [*MANAGE, "run_intent_workers", "--drain", "--kinds", kind, "-v", "0"]
        if variant.style == "sync":
            w = sizes["io_workers"]
            return [[*argv, "--workers", str(w)]], f"--workers {w}", w
        c = sizes["io_concurrency"]
        return [[*argv, "--concurrency", str(c)]], f"--concurrency {c}", c

    def states(self, variant: Variant) -> tuple[int, int, float | None]:
        from django.db.models import Count, Max, Q

        from django_intents.models import Intent

        expected = "cancelled" if variant.fail else "completed"
        other = "completed" if variant.fail else "cancelled"
        row = Intent.objects.aggregate(
            good=Count("id", filter=Q(state=expected)),
            bad=Count("id", filter=Q(state=other)),
            last=Max("updated_at", filter=Q(state__in=[expected, other])),
        )
        return row["good"], row["bad"], row["last"] and row["last"].timestamp()


class TasksDB(IOSystem):
    """``db_worker`` runs one task at a time, so waiting work needs more processes."""

    styles = ("sync",)

    def fill(self, n: int, variant: Variant) -> None:
        from .benchapp import djtasks

        task = djtasks.io_sleep if variant.mode == "sleep" else djtasks.io_http
        for start in range(0, n, 500):
            with transaction.atomic():
                for _ in range(start, min(start + 500, n)):
                    task.enqueue(fail=variant.fail)

    def workers(self, variant: Variant, sizes: dict[str, int]) -> Workers:
        argv = [*MANAGE, "db_worker", "--interval", POLL, "--no-startup-delay", "--no-reload"]
        count = sizes["io_tasks_db_processes"]
        return [[*argv, "--batch", "-v", "0"]] * count, f"{count} × db_worker", count

    def states(self, variant: Variant) -> tuple[int, int, float | None]:
        from django.db.models import Count, Max, Q
        from django_tasks_db.models import DBTaskResult

        expected = "FAILED" if variant.fail else "SUCCESSFUL"
        other = "SUCCESSFUL" if variant.fail else "FAILED"
        row = DBTaskResult.objects.aggregate(
            good=Count("id", filter=Q(status=expected)),
            bad=Count("id", filter=Q(status=other)),
            last=Max("finished_at"),
        )
        return row["good"], row["bad"], row["last"] and row["last"].timestamp()


class Procrastinate(IOSystem):
    """Async tasks and ``--concurrency``: Procrastinate's documented way to wait."""

    styles = ("async",)

    def fill(self, n: int, variant: Variant) -> None:
        from .benchapp import tasks

        task = tasks.io_asleep if variant.mode == "sleep" else tasks.io_ahttp
        for start in range(0, n, 500):
            task.batch_defer(*({"fail": variant.fail} for _ in range(start, min(start + 500, n))))

    def workers(self, variant: Variant, sizes: dict[str, int]) -> Workers:
        c = sizes["io_concurrency"]
        argv = [*MANAGE, "procrastinate", "worker", "--concurrency", str(c), "--one-shot"]
        return [argv], f"--concurrency {c}", c

    def states(self, variant: Variant) -> tuple[int, int, float | None]:
        expected = "failed" if variant.fail else "succeeded"
        other = "succeeded" if variant.fail else "failed"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FILTER (WHERE j.status = %s), "
                "count(*) FILTER (WHERE j.status = %s), max(e.at) "
                "FROM procrastinate_jobs j LEFT JOIN procrastinate_events e "
                "ON e.job_id = j.id AND e.type IN ('succeeded', 'failed')",
                [expected, other],
            )
            good, bad, last = cursor.fetchone()
        return good, bad, last and last.timestamp()


IO_SYSTEMS: dict[str, type[IOSystem]] = {
    "intents": Intents,
    "tasks_db": TasksDB,
    "procrastinate": Procrastinate,
}
