"""The io workload: jobs that wait 100 ms on a timer or a real HTTP call, then succeed or fail.

Real handlers spend their time waiting on a partner, and partners go down.
This measures what a queue costs around such waits: how many jobs per second
one worker process gets through with 1,000 waits in flight, how many
connections it holds on the database server meanwhile (counted by the server,
``pg_stat_activity`` or ``information_schema.processlist``, every 50 ms), its
CPU and peak memory (``wait4`` of each worker process: the same accounting as
``getrusage(RUSAGE_CHILDREN)``, per process), and whether every job ended
where it should. A failing partner must cost no more than a healthy one, so
every variant runs again with every call failing and ``MAX_ATTEMPTS`` 1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from .io_systems import IO_SYSTEMS, VARIANTS, IOSystem, Variant

if TYPE_CHECKING:
    from .suite import Suite

SAMPLE_S = 0.05


class ConnectionSampler(threading.Thread):
    """Peak server-side connections to database ``name``, this sampler's own excluded.

    It connects to the server's maintenance database, not to the one it
    watches, and filters out its own backend too, so the figure is the
    workers' alone (the suite closes its own connection before they start).
    """

    def __init__(self, vendor: str, name: str) -> None:
        super().__init__(daemon=True)
        self.vendor, self.name = vendor, name
        self.peak: int | None = None
        self.samples = 0
        self.halt = threading.Event()
        self.error: str | None = None

    def _connect(self) -> tuple[Any, str]:
        if self.vendor == "postgresql":
            import psycopg

            conn = psycopg.connect(
                host=os.environ.get("PGHOST", "127.0.0.1"),
                port=os.environ.get("PGPORT", "5432"),
                user=os.environ.get("PGUSER", "postgres"),
                dbname="postgres",
                autocommit=True,
            )
            return conn, (
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()"
            )
        import MySQLdb

        conn = MySQLdb.connect(
            host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
            port=int(os.environ.get("MYSQL_PORT", "3306")),
            user=os.environ.get("MYSQL_USER", "root"),
            password=os.environ.get("MYSQL_PASSWORD", ""),
            autocommit=True,
        )
        return conn, (
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE db = %s AND id <> CONNECTION_ID()"
        )

    def run(self) -> None:
        if self.vendor not in ("postgresql", "mysql"):
            return
        try:
            conn, sql = self._connect()
        except Exception as exc:  # a sampler that cannot connect reports, never stalls the run
            self.error = str(exc)
            return
        try:
            while not self.halt.is_set():
                cursor = conn.cursor()
                cursor.execute(sql, [self.name])
                count = int(cursor.fetchone()[0])
                cursor.close()
                self.peak = count if self.peak is None else max(self.peak, count)
                self.samples += 1
                self.halt.wait(SAMPLE_S)
        finally:
            conn.close()

    def stop(self) -> int | None:
        self.halt.set()
        self.join(10)
        return self.peak


def _reap(procs: list[subprocess.Popen[bytes]], timeout: float) -> tuple[list[Any], bool]:
    """Wait for every process with ``wait4``, keeping each one's own rusage.

    A process still running after ``timeout`` seconds is sent SIGTERM, then
    SIGKILL; the second element says that happened.
    """
    pending = {proc.pid: proc for proc in procs}
    usages: list[Any] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    while pending:
        for pid, proc in list(pending.items()):
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                proc.returncode = os.waitstatus_to_exitcode(status)
                usages.append(usage)
                del pending[pid]
        if pending and time.monotonic() > deadline:
            timed_out = True
            sig = signal.SIGTERM if time.monotonic() < deadline + 15 else signal.SIGKILL
            for pid in pending:
                with suppress(ProcessLookupError):
                    os.kill(pid, sig)
        time.sleep(0.02)
    return usages, timed_out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def partner(suite: Suite, delay: float) -> Iterator[tuple[str, dict[str, float]]]:
    """Run ``bench/http_server.py`` for one variant; afterwards ``out["cpu"]`` is its CPU."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.http_server", "--port", str(port), "--delay", str(delay)],
        cwd=suite.work,
        env=suite.env,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError("bench/http_server.py did not start")
    out: dict[str, float] = {}
    try:
        yield f"http://127.0.0.1:{port}", out
    finally:
        proc.terminate()
        usages, _ = _reap([proc], 15)
        proc.stdout.close()
        out["cpu"] = sum(u.ru_utime + u.ru_stime for u in usages)


def _last_log_line(suite: Suite) -> str:
    lines = [line for line in suite.log.read_text(errors="replace").splitlines() if line.strip()]
    # argparse and Django's command errors put the reason after "error: ".
    return lines[-1].rpartition("error: ")[2][:200] if lines else "no output"


def run_variant(
    suite: Suite, io: IOSystem, variant: Variant, sizes: dict[str, Any]
) -> dict[str, Any]:
    """Fill, start the workers, sample until they exit, then check every job's final state."""
    from django.db import connection

    # The slower peers get fewer jobs (``io_<system>``), so that each variant
    # lasts tens of seconds, not minutes; the rate does not depend on the count.
    n = sizes.get(f"io_{suite.system.name}", sizes["io"])
    delay = sizes["io_delay"]
    suite.reset()
    io.fill(n, variant)
    argvs, setting, in_flight = io.workers(variant, sizes)
    row: dict[str, Any] = {"variant": variant.name, "style": variant.style, "mode": variant.mode}
    row.update(fail=variant.fail, setting=setting, n=n, processes=len(argvs))
    row["load"] = os.getloadavg()[0]
    connection.close()  # the sampler counts the workers' connections only
    env = {
        **suite.env,
        "BENCH_IO_DELAY": str(delay),
        "BENCH_IO_POOL": str(max(in_flight // len(argvs), 1)),
        "BENCH_MAX_ATTEMPTS": "1",
    }
    server = partner(suite, delay) if variant.mode == "http" else None
    with server if server is not None else _no_server() as (url, server_cpu):
        env["BENCH_IO_URL"] = url
        sampler = ConnectionSampler(suite.vendor, connection.settings_dict["NAME"])
        sampler.start()
        with suite.log.open("ab") as log:
            procs = [
                subprocess.Popen(
                    argv, cwd=suite.work, env=env, stdout=log, stderr=subprocess.STDOUT
                )
                for argv in argvs
            ]
        usages, timed_out = _reap(procs, sizes["io_timeout"])
        row["peak_connections"] = sampler.stop()
    if server is not None:
        row["server_cpu_s"] = server_cpu["cpu"]
    row["exit"] = max(abs(p.returncode or 0) for p in procs)
    row["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usages)
    row["rss_mb"] = max(u.ru_maxrss for u in usages) / 1024
    row["rss_total_mb"] = sum(u.ru_maxrss for u in usages) / 1024
    firsts = [float(p.read_text()) for p in suite.stamps.glob("first-*")]
    good, bad, last = io.states(variant)
    row.update(done=good + bad, wrong=bad, left=n - good - bad)
    if timed_out:
        row["timed_out"] = sizes["io_timeout"]
    if not firsts or last is None or not good + bad:
        return {
            **row,
            "error": f"worker exit {row['exit']}: {_last_log_line(suite)}",
        }
    row["seconds"] = last - min(firsts)
    row["per_s"] = (good + bad) / row["seconds"]
    # At most ``in_flight`` jobs wait at once, each at least ``delay``: a faster
    # figure means the handlers did not really wait (a coroutine never awaited).
    if row["per_s"] > in_flight / delay * 1.05:
        row["error"] = f"{row['per_s']:.0f}/s is above {in_flight} in flight ÷ {delay} s"
    return row


@contextmanager
def _no_server() -> Iterator[tuple[str, dict[str, float]]]:
    yield "http://127.0.0.1:9", {}


def io(suite: Suite, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant this system runs, in the order of the report."""
    cls = IO_SYSTEMS.get(suite.system.name)
    if cls is None:
        return []
    adapter = cls()
    # The HTTP clients and server come with the bench group; the test venvs,
    # which run the smoke test, have neither, so those variants are skipped there.
    http = all(find_spec(name) is not None for name in ("aiohttp", "urllib3"))
    rows: list[dict[str, Any]] = []
    for variant in VARIANTS:
        if variant.style not in adapter.styles:
            continue
        if sizes.get("io_variants") is not None and variant.name not in sizes["io_variants"]:
            continue
        if variant.mode == "http" and not http:
            print(f"   io: {variant.name} skipped, aiohttp or urllib3 missing", file=sys.stderr)
            continue
        print(f"   io: {variant.name}", file=sys.stderr, flush=True)
        try:
            rows.append(run_variant(suite, adapter, variant, sizes))
        except Exception as exc:  # one broken variant must not hide the others
            rows.append(
                {"variant": variant.name, "style": variant.style, "mode": variant.mode}
                | {"fail": variant.fail, "error": f"{type(exc).__name__}: {exc}"}
            )
    return rows
