"""A pool's database connections do not grow with ``--workers`` or ``--concurrency`` (SPEC §9).

Issue 14 found a pool of 256 sync workers whose handlers all failed taking
every connection PostgreSQL had: each worker thread opened its own to record
its failure. Here a real ``run_intent_workers --drain`` (tests/workerutil.py)
runs thousands of attempts that touch no ORM, failing and succeeding, with 256
sync workers and with 1,000 async attempts in flight, while a thread counts the
worker's connections every 50 ms as the database server sees them:
``pg_stat_activity`` on PostgreSQL, ``information_schema.processlist`` on
MariaDB/MySQL and, SQLite having no server, the worker process's open file
descriptors on the database file. The peak must stay at 3 plus the LISTEN
connection, and every result must be recorded: the rows are checked after.

Each database runs the same tests with its own way of counting; nothing is
skipped on any of them, so CI (``tests/run.py --require-all``) cannot pass
without having counted on all three.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection, connections

from django_intents.models import Intent

from .conftest import external_kinds
from .testapp.quiet import HANDLERS as QUIET_HANDLERS
from .workerutil import Worker, wait_for

INTENTS = 2_000
# Claims, renewals and results (SPEC §9), plus PostgreSQL's LISTEN connection.
MAX_CONNECTIONS = 4
SAMPLE_EVERY = 0.05
DRAIN_TIMEOUT = 60.0
SYNC_POOL = ["--workers", "256"]
ASYNC_POOL = ["--concurrency", "1000"]


# -- counting the worker's connections, as each database sees them ------------------------


def server_count(sql: str) -> Callable[[int], int]:
    """Count with ``sql`` on this thread's own connection, which the query leaves out."""

    def count(pid: int) -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql, [connection.settings_dict["NAME"]])
            return int(cursor.fetchone()[0])

    return count


def sqlite_count(pid: int) -> int:
    """The worker's open descriptors on the database file: one per SQLite connection.

    The ``-wal`` and ``-shm`` files are not counted; each connection opens the
    main file once.
    """
    database = os.path.realpath(connection.settings_dict["NAME"])
    fds = Path(f"/proc/{pid}/fd")
    opened = 0
    try:
        entries = list(fds.iterdir())
    except FileNotFoundError:  # the worker has exited
        return 0
    for fd in entries:
        try:
            if os.readlink(fd) == database:
                opened += 1
        except (FileNotFoundError, OSError):  # closed while we looked
            continue
    return opened


COUNTERS: dict[str, Callable[[int], int]] = {
    "postgresql": server_count(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    ),
    "mysql": server_count(
        "SELECT count(*) FROM information_schema.processlist "
        "WHERE db = %s AND id <> CONNECTION_ID()"
    ),
    "sqlite": sqlite_count,
}


def counter() -> Callable[[int], int]:
    """This database's way of counting; a database without one fails, it is never skipped."""
    try:
        return COUNTERS[connection.vendor]
    except KeyError:
        pytest.fail(f"no way to count {connection.vendor} connections: add one to COUNTERS")


class Sampler:
    """Counts the worker's connections every 50 ms on a thread of its own until stopped."""

    def __init__(self, count: Callable[[int], int], pid: int) -> None:
        self.count, self.pid = count, pid
        self.samples: list[int] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.samples.append(self.count(self.pid))
                self._stop.wait(SAMPLE_EVERY)
        except BaseException as error:  # reported by stop(), not lost in a thread
            self.errors.append(error)
        finally:
            connections.close_all()  # this thread's, so the test database can be dropped

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        assert not self.errors, f"counting connections failed: {self.errors[0]!r}"
        return self.samples


# -- running a drain and counting ---------------------------------------------------------


@pytest.fixture
def drain(transactional_db: None) -> Iterator[Callable[..., tuple[list[int], Worker]]]:
    """``drain(kind, *flags)``: enqueue INTENTS of ``kind``, drain them, return the samples.

    With ``MAX_ATTEMPTS`` 1 a failure is final, so every intent ends completed
    or cancelled and ``--drain`` does not stop at retries scheduled for later.
    The handlers (tests/testapp/quiet.py) are the worker's through its
    ``INTENTS["HANDLERS"]`` only, so the kinds are declared for enqueue here.
    """
    started: list[Worker] = []

    def run(kind: str, *flags: str) -> tuple[list[int], Worker]:
        with external_kinds(*QUIET_HANDLERS):
            Intent.objects.enqueue_many(
                {
                    "kind": kind,
                    "event_id": f"e-{n}",
                    "target": "https://partner/",
                    "payload": {"n": n},
                }
                for n in range(INTENTS)
            )
        count = counter()
        # Only the worker may be connected to the test database while it runs:
        # wait until the server has let this test's connection go (counting
        # reopens it, so close it once more after).
        connection.close()
        wait_for(lambda: count(os.getpid()) == 0, "the test's own connections to go")
        connection.close()
        settings = {"MAX_ATTEMPTS": 1, "LEASE": 30, "HANDLERS": QUIET_HANDLERS}
        worker = Worker(["--drain", "--kinds", kind, *flags], settings, {})
        started.append(worker)
        sampler = Sampler(count, worker.proc.pid)
        try:
            code: int | None = worker.proc.wait(DRAIN_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            samples = sampler.stop()
        assert code is not None, (
            f"the drain still ran after {DRAIN_TIMEOUT:g} s; {shape(samples)}; {log_tail(worker)}"
        )
        assert code == 0, f"the drain exited {code}; {log_tail(worker)}"
        assert samples, "no sample was taken while the worker ran"
        return samples, worker

    yield run
    for worker in started:
        worker.cleanup()


def shape(samples: list[int]) -> str:
    """What the samples were, short enough to read in a failure message."""
    return f"{len(samples)} samples, values {sorted(set(samples))}"


def log_tail(worker: Worker, lines: int = 10) -> str:
    """The end of the worker's log: a drain of 2,000 failures logs 2,000 warnings."""
    return "log (end):\n" + "\n".join(worker.log.splitlines()[-lines:])


def assert_every_result_recorded(kind: str, state: str, error: str | None) -> None:
    """All INTENTS rows of ``kind`` are in ``state`` after one attempt, with ``error`` or none."""
    rows = Intent.objects.filter(kind=kind)
    assert rows.count() == INTENTS
    assert list(rows.order_by().values_list("state", "attempts").distinct()) == [(state, 1)]
    assert not rows.exclude(claim_token="").exists()
    if error is None:
        assert not rows.exclude(last_error="").exists()
    else:
        assert rows.filter(last_error__contains=error).count() == INTENTS


@pytest.mark.parametrize(
    ("kind", "flags"),
    [("test.quiet_fail", SYNC_POOL), ("test.async_quiet_fail", ASYNC_POOL)],
    ids=["sync-256-workers", "async-concurrency-1000"],
)
def test_a_pool_whose_every_attempt_fails_records_every_result_on_its_few_connections(
    drain: Callable[..., tuple[list[int], Worker]], kind: str, flags: list[str]
):
    samples, worker = drain(kind, *flags)

    peak = max(samples)
    assert 1 <= peak <= MAX_CONNECTIONS, (
        f"peak {peak} connections with {' '.join(flags)}; {shape(samples)}; {log_tail(worker)}"
    )
    assert_every_result_recorded(kind, "cancelled", "ValueError: partner down")


@pytest.mark.parametrize(
    ("kind", "flags"),
    [("test.quiet", SYNC_POOL), ("test.async_quiet", ASYNC_POOL)],
    ids=["sync-256-workers", "async-concurrency-1000"],
)
def test_a_pool_whose_every_attempt_succeeds_stays_on_its_few_connections(
    drain: Callable[..., tuple[list[int], Worker]], kind: str, flags: list[str]
):
    samples, worker = drain(kind, *flags)

    peak = max(samples)
    assert 1 <= peak <= MAX_CONNECTIONS, (
        f"peak {peak} connections with {' '.join(flags)}; {shape(samples)}; {log_tail(worker)}"
    )
    assert_every_result_recorded(kind, "completed", None)


def test_sync_and_async_pools_whose_attempts_all_fail_peak_at_the_same_connection_count(
    drain: Callable[..., tuple[list[int], Worker]],
):
    """256 threads or 1,000 coroutines: the pool's constant does not depend on either.

    "The same" allows one connection of difference: SPEC §9 lets a start-up
    check open one more briefly, which a 50 ms sample may or may not catch. A
    pool whose connections grew with its size would be dozens apart.
    """
    sync_samples, _ = drain("test.quiet_fail", *SYNC_POOL)
    async_samples, _ = drain("test.async_quiet_fail", *ASYNC_POOL)

    shapes = f"sync: {shape(sync_samples)}; async: {shape(async_samples)}"
    assert max(sync_samples) <= MAX_CONNECTIONS, shapes
    assert max(async_samples) <= MAX_CONNECTIONS, shapes
    assert abs(max(sync_samples) - max(async_samples)) <= 1, shapes
    assert_every_result_recorded("test.quiet_fail", "cancelled", "partner down")
    assert_every_result_recorded("test.async_quiet_fail", "cancelled", "partner down")
