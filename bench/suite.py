"""The workloads, for one system on one database: ``bench/run.py`` runs this once per pair.

    BENCH_DB=postgresql BENCH_SYSTEM=intents python -m bench.suite '{"drain": 5000, ...}' out.json

Every workload starts from emptied tables, times only what it names, and
checks that every job it started really finished, so a broken run fails
loudly instead of reporting a fast nonsense figure.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _create_database(vendor: str, name: str) -> None:
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=os.environ.get("PGPORT", "5432"),
            user=os.environ.get("PGUSER", "postgres"),
            dbname="postgres",
            autocommit=True,
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    elif vendor == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(
            host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
            port=int(os.environ.get("MYSQL_PORT", "3306")),
            user=os.environ.get("MYSQL_USER", "root"),
            password=os.environ.get("MYSQL_PASSWORD", ""),
        )
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )
        conn.close()


def _pythonpath() -> str:
    """``ROOT``, after ``BENCH_CODE`` if set: another copy of django_intents to measure.

    Processes start in the work directory, not in ``ROOT``, so that the current
    directory does not put the working tree's package ahead of ``BENCH_CODE``.
    """
    code = os.environ.get("BENCH_CODE")
    return os.pathsep.join([code, str(ROOT)] if code else [str(ROOT)])


class Suite:
    def __init__(self, sizes: dict[str, Any]) -> None:
        from django.conf import settings

        from .systems import SYSTEMS

        self.sizes = sizes
        self.vendor = settings.VENDOR
        self.system = SYSTEMS[settings.SYSTEM]()
        self.work = Path(settings.WORK)
        self.stamps = self.work / f"stamps-{settings.SYSTEM}-{self.vendor}"
        self.log = self.work / f"workers-{settings.SYSTEM}-{self.vendor}.log"
        self.log.write_bytes(b"")
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PYTHONPATH": _pythonpath(),
            "BENCH_STAMPS": str(self.stamps),
        }

    # -- plumbing --------------------------------------------------------------

    def reset(self) -> None:
        """Empty the system's tables, leaving no dead rows behind."""
        from django.db import connection

        tables = self.system.tables()
        with connection.cursor() as cursor:
            if self.vendor == "postgresql":
                cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
            elif self.vendor == "mysql":
                cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
                for table in tables:
                    cursor.execute(f"TRUNCATE TABLE {table}")
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
            else:
                for table in tables:
                    cursor.execute(f"DELETE FROM {table}")
        if self.vendor == "sqlite":
            connection.close()
            with connection.cursor() as cursor:
                cursor.execute("VACUUM")
        shutil.rmtree(self.stamps, ignore_errors=True)
        self.stamps.mkdir(parents=True)

    def start(self, argvs: list[list[str]]) -> list[subprocess.Popen[bytes]]:
        log = self.log.open("ab")
        try:
            return [
                subprocess.Popen(
                    argv, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT
                )
                for argv in argvs
            ]
        finally:
            log.close()

    def stop(self, procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
        for proc in procs:
            with suppress(ProcessLookupError):
                proc.send_signal(sig)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def read_stamps(self) -> dict[str, tuple[float, int]]:
        seen: dict[str, tuple[float, int]] = {}
        for path in self.stamps.glob("stamps-*"):
            for line in path.read_text().splitlines():
                key, at, pid = line.split()
                seen.setdefault(key, (float(at), int(pid)))
        return seen

    def wait_for(self, key: str, timeout: float, pid: int | None = None) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in self.stamps.glob("stamps-*"):
                for line in path.read_text().splitlines():
                    k, at, p = line.split()
                    if k == key and (pid is None or int(p) == pid):
                        return float(at)
            time.sleep(0.002)
        raise RuntimeError(f"{self.system.label}: job {key!r} did not start in {timeout} s")

    @contextmanager
    def cpu(self) -> Any:
        """Yield a dict that gets the CPU seconds of the children waited for inside."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out: dict[str, float] = {}
        yield out
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    # -- workloads -------------------------------------------------------------

    def enqueue(self) -> dict[str, Any]:
        from django.db import connection

        n, m = self.sizes["enqueue_one"], self.sizes["enqueue_many"]
        connection.ensure_connection()
        self.reset()
        started = time.perf_counter()
        for i in range(n):
            self.system.enqueue_one("noop", f"one-{i}", i)
        one = n / (time.perf_counter() - started)
        result: dict[str, Any] = {"one": {"api": self.system.one_label, "n": n, "per_s": one}}
        if self.system.has_batch:
            self.reset()
            keys = [f"many-{i}" for i in range(m)]
            started = time.perf_counter()
            for start in range(0, m, 500):
                self.system.enqueue_batch("noop", keys[start : start + 500])
            many = m / (time.perf_counter() - started)
            result["many"] = {"api": self.system.batch_label, "n": m, "per_s": many}
        return result

    def startup_cpu(self) -> float:
        """CPU seconds of starting and stopping one drained worker on an empty queue."""
        self.reset()
        with self.cpu() as used:
            for proc in self.start(self.system.workers(1, drain=True)):
                proc.wait(120)
        return used["cpu"]

    def large(self, workers: int, n: int, churned: int) -> dict[str, Any]:
        """The drain with ``churned`` finished rows, and on PostgreSQL again after VACUUM.

        The churned rows leave dead tuples behind (two updates each). On
        PostgreSQL they stay until a VACUUM, so the drain is measured as the
        churn left the table, then once more after ``VACUUM``, which is what
        autovacuum would do (it is off on the server this was published from).
        """
        self.reset()
        started = time.perf_counter()
        self.system.churn(churned)
        churn_s = time.perf_counter() - started
        timeout = self.sizes["large_timeout"]
        result = self.drain(workers, n, reset=False, timeout=timeout)
        result.update(churned=churned, churn_s=churn_s)
        if self.vendor == "postgresql":
            from django.db import connection

            started = time.perf_counter()
            with connection.cursor() as cursor:
                for table in self.system.tables():
                    cursor.execute(f"VACUUM {table}")
            result["vacuum_s"] = time.perf_counter() - started
            result["vacuumed"] = self.drain(
                workers, n, reset=False, prefix="after-vacuum", timeout=timeout
            )
        return result

    def drain(
        self,
        workers: int,
        n: int,
        *,
        reset: bool = True,
        prefix: str = "noop",
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        if reset:
            self.reset()
        else:
            shutil.rmtree(self.stamps, ignore_errors=True)
            self.stamps.mkdir(parents=True)
        self.system.fill(n, prefix=prefix)
        before, _ = self.system.finished()
        load = os.getloadavg()[0]
        timed_out = False
        with self.cpu() as used:
            procs = self.start(self.system.workers(workers, drain=True))
            deadline = time.monotonic() + timeout
            for proc in procs:
                try:
                    status = proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    self.stop(procs)
                    break
                if status != 0:
                    raise RuntimeError(f"{self.system.label} worker exited {status}")
        firsts = [float(p.read_text()) for p in self.stamps.glob("first-*")]
        done, last = self.system.finished()
        done -= before
        if not firsts or last is None or not done or (done != n and not timed_out):
            raise RuntimeError(f"{self.system.label}: {done} of {n} jobs finished")
        seconds = last - min(firsts)
        result = {
            "workers": workers,
            "n": n,
            "seconds": seconds,
            "per_s": done / seconds,
            "cpu_s": used["cpu"],
            "load": load,
        }
        if timed_out:
            # Stopped after ``timeout`` seconds: the rate is of the jobs that finished.
            result.update(timed_out=timeout, done=done)
        return result

    def latency(self, count: int, gap: float, workers: int) -> dict[str, Any]:
        self.reset()
        procs = self.start(self.system.workers(workers, drain=False))
        try:
            self.system.enqueue_one("stamp", "warm-up", 0)
            self.wait_for("warm-up", 60)
            time.sleep(0.5)
            load = os.getloadavg()[0]
            committed: dict[str, float] = {}
            next_at = time.monotonic()
            for i in range(count):
                next_at += gap
                time.sleep(max(next_at - time.monotonic(), 0))
                key = f"lat-{i}"
                self.system.enqueue_one("stamp", key, i)
                committed[key] = time.time()
            for key in committed:
                self.wait_for(key, 30)
        finally:
            self.stop(procs)
        seen = self.read_stamps()
        ms = sorted((seen[key][0] - at) * 1000 for key, at in committed.items())
        return {
            "workers": workers,
            "n": count,
            "gap_ms": gap * 1000,
            "p50_ms": statistics.median(ms),
            "p99_ms": ms[min(len(ms) - 1, round(len(ms) * 0.99) - 1)],
            "max_ms": ms[-1],
            "load": load,
        }

    def crash(self, lease: float | None) -> dict[str, Any]:
        """SIGKILL the worker running an intent; time until another worker starts it."""
        self.reset()
        first = self.start(self.system.workers(1, drain=False, lease=lease))[0]
        second = None
        try:
            self.system.enqueue_one("block", "victim", 0)
            self.wait_for("victim", 60, pid=first.pid)
            second = self.start(self.system.workers(1, drain=False, lease=lease))[0]
            self.system.enqueue_one("stamp", "second-ready", 0)
            self.wait_for("second-ready", 60, pid=second.pid)
            killed = time.time()
            first.kill()
            first.wait()
            rerun = self.wait_for("victim", (lease or 30) * 2 + 30, pid=second.pid)
        finally:
            self.stop([p for p in (first, second) if p is not None], signal.SIGKILL)
        return {"lease_s": lease or 30.0, "seconds": rerun - killed}


def main() -> int:
    sizes, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    from . import settings as bench_settings

    _create_database(bench_settings.VENDOR, bench_settings.NAME)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    suite = Suite(sizes)
    results: dict[str, Any] = {"system": suite.system.name, "db": suite.vendor}
    workloads = sizes["workloads"]
    if "enqueue" in workloads:
        results["enqueue"] = suite.enqueue()
    if "drain" in workloads:
        results["startup_cpu_s"] = suite.startup_cpu()
        results["drain"] = [suite.drain(w, sizes["drain"]) for w in sizes["workers"]]
    if "latency" in workloads:
        results["latency"] = suite.latency(sizes["latency"], sizes["gap"], sizes["latency_workers"])
    if "large" in workloads and suite.vendor in sizes["large_dbs"]:
        results["large"] = suite.large(sizes["large_workers"], sizes["drain"], sizes["churned"])
    if "crash" in workloads and suite.system.name == "intents":
        # The default lease's figure is the lease itself on every database;
        # it is measured once, on PostgreSQL, which keeps the run short.
        leases = [
            lease for lease in sizes["leases"] if lease is not None or suite.vendor == "postgresql"
        ]
        results["crash"] = [suite.crash(lease) for lease in leases]
    if "io" in workloads and suite.vendor in sizes["io_dbs"]:
        from .io_workload import io

        results["io"] = io(suite, sizes)
    if (
        "processes" in workloads
        and suite.vendor in sizes["processes_dbs"]
        and suite.system.name == "intents"
    ):
        from .processes_workload import processes

        results["processes"] = processes(suite, sizes)
    if "relay" in workloads and suite.vendor in sizes["relay_dbs"]:
        from .relay_workload import relay

        results["relay"] = relay(suite, sizes)
    suite.reset()
    out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
