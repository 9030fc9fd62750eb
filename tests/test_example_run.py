"""The README's first command, ``python3 example_project/run.py``, run as a newcomer would.

Each test runs the script in a fresh directory with this interpreter (it is a
virtual environment that has everything, so the script skips creating
``.venv``) and on the database under test: SQLite in the temporary directory,
or a database of its own on the PostgreSQL or MariaDB server, reached through
``DATABASE_URL`` exactly as a user would point the example at one.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_intents import intent_id

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "example_project" / "run.py"
MANAGE = ROOT / "manage.py"
STATES = ("pending", "running", "completed", "cancelled")
SAMPLE_ORDERS = 6  # seed_shop's SAMPLES
TABLE_ROW = re.compile(r"^([\w.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", re.MULTILINE)


def free_port_pair() -> int:
    """A port that is free, and so is the next one (the workers' metrics).

    Drawn below the kernel's ephemeral range (``ip_local_port_range``, from
    32768 by default): a port the kernel handed out for the probe is the kind
    it hands the next outgoing connection too, and one did take the metrics'
    port between this check and the workers' bind while another suite ran.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = max(5000, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]))
    chooser = random.Random()
    for _ in range(200):
        port = chooser.randrange(max(1024, low - 12_000), low - 1)
        try:
            for candidate in (port, port + 1):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return False
    return True


@pytest.fixture
def database_url(django_db_setup: None, django_db_blocker: Any) -> Iterator[str | None]:
    """``DATABASE_URL`` of an empty database on the server under test; None for SQLite."""
    if connection.vendor == "sqlite":
        yield None
        return
    db = connection.settings_dict
    name = f"{db['NAME']}_example"
    quoted = connection.ops.quote_name(name)
    if connection.vendor == "postgresql":
        scheme, create = "postgres", f"CREATE DATABASE {quoted}"
        drop = f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"
    else:
        scheme, create = "mysql", f"CREATE DATABASE {quoted} CHARACTER SET utf8mb4"
        drop = f"DROP DATABASE IF EXISTS {quoted}"
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(drop)
        cursor.execute(create)
    credentials = urllib.parse.quote(db["USER"], safe="")
    if db["PASSWORD"]:
        credentials += ":" + urllib.parse.quote(db["PASSWORD"], safe="")
    try:
        yield f"{scheme}://{credentials}@{db['HOST']}:{db['PORT']}/{name}"
    finally:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(drop)


def environment(database_url: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def summary_rows(output: str) -> dict[str, dict[str, int]]:
    rows = {}
    for kind, *numbers in TABLE_ROW.findall(output):
        rows[kind] = dict(zip((*STATES, "total"), map(int, numbers), strict=True))
    return rows


def test_drain_sets_up_a_fresh_shop_processes_every_intent_and_prints_a_summary(
    tmp_path: Path, database_url: str | None
):
    command = [sys.executable, str(RUN), "--drain", "--dir", str(tmp_path)]
    # --fail 0 keeps the run short and its outcome exact: only the sample whose
    # partner refuses the first attempt is retried (once, after about 2 s).
    command += ["--port", str(free_port_pair()), "--fail", "0", "--timeout", "60"]

    result = subprocess.run(
        command, env=environment(database_url), capture_output=True, text=True, timeout=120
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "creating" not in output  # this interpreter was used; no .venv was made
    assert "created superuser 'admin' (password 'admin')" in output
    rows = summary_rows(result.stdout)
    assert set(rows) == {"digest", "django.tasks", "push", "webhook", "all"}, output
    # The daily digest's schedule: its most recent slot, enqueued by the first pool.
    assert rows["digest"] == {
        "pending": 0, "running": 0, "completed": 1, "cancelled": 0, "total": 1,
    }  # fmt: skip
    # Each order's send_receipt task, enqueued with it as the order view does.
    assert rows["django.tasks"] == {
        "pending": 0,
        "running": 0,
        "completed": SAMPLE_ORDERS,
        "cancelled": 0,
        "total": SAMPLE_ORDERS,
    }
    # Every order's placed push, plus the shipped one; two of them sent inline.
    assert rows["push"] == {
        "pending": 0,
        "running": 0,
        "completed": SAMPLE_ORDERS + 1,
        "cancelled": 0,
        "total": SAMPLE_ORDERS + 1,
    }
    # One partner answers 410 Gone: cancelled at once; the others take theirs.
    assert rows["webhook"] == {
        "pending": 0,
        "running": 0,
        "completed": SAMPLE_ORDERS - 1,
        "cancelled": 1,
        "total": SAMPLE_ORDERS,
    }
    assert rows["all"]["total"] == 3 * SAMPLE_ORDERS + 2
    assert f"receiver: {SAMPLE_ORDERS - 1} webhooks stored" in result.stdout
    assert f"{SAMPLE_ORDERS + 1} pushes sent, {SAMPLE_ORDERS} receipts sent" in result.stdout
    # The worker logged the retry and the cancellation, and the script drained again.
    assert re.search(r"\(attempt 1\): failed: DeliveryFailed: .*HTTP 503; retry in \d+ s", output)
    assert re.search(r"\(attempt 1\): stopped by its handler, cancelled: .*HTTP 410", output)
    assert "1 intent(s) wait for a retry" in output
    assert re.search(r"drained in [\d.]+ s, 2 worker run\(s\)", output)
    if database_url is None:
        assert (tmp_path / "example.sqlite3").exists()


class Output:
    """Lines of a running process, read in a thread so that waiting can time out."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        for line in process.stdout or ():
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")


def admin_session(site: str) -> urllib.request.OpenerDirector:
    """Log in to the admin with the credentials the script printed."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    login = site + "admin/login/"
    page = fetch(opener, login)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page
    form = {"csrfmiddlewaretoken": token[1], "username": "admin", "password": "admin"}
    form["next"] = "/admin/"
    request = urllib.request.Request(  # noqa: S310 - an http URL built above
        login, data=urllib.parse.urlencode(form).encode(), headers={"Referer": login}
    )
    with opener.open(request, timeout=10) as landed:
        assert landed.url.endswith("/admin/"), landed.url
    return opener


def fetch(opener: Any, url: str) -> str:
    with opener.open(url, timeout=10) as response:
        return str(response.read().decode())


def test_the_interactive_run_serves_the_shop_and_workers_until_ctrl_c(
    tmp_path: Path, database_url: str | None
):
    port = free_port_pair()
    site = f"http://127.0.0.1:{port}/"
    command = [sys.executable, str(RUN), "--dir", str(tmp_path), "--port", str(port)]
    with subprocess.Popen(
        [*command, "--fail", "0"],
        env=environment(database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        output = Output(process)
        try:
            output.wait_for(r"admin .*user 'admin', password 'admin'")
            output.wait_for(r"Ctrl-C stops")
            output.wait_for(r"\d+ completed, 1 cancelled")  # the workers are at it

            web = urllib.request.build_opener()
            assert "Espresso machine" in fetch(web, site)
            assert "django_intents_transitions_total" in fetch(web, site + "metrics")
            workers_metrics = fetch(web, f"http://127.0.0.1:{port + 1}/metrics")
            assert "django_intents_handler_duration_seconds" in workers_metrics
            # The admin lists the example's intents, searchable by event id.
            admin = admin_session(site)
            listing = fetch(admin, site + "admin/django_intents/intent/")
            receiver = site + "webhooks/receive/"
            assert intent_id("webhook", "order-1-placed", receiver) in listing
            assert intent_id("push", "order-1-shipped", "customer:ada@example.com") in listing
            # Task intents are listed with their function as the target.
            assert "example_project.shop.tasks.send_receipt" in listing
            found = fetch(admin, site + "admin/django_intents/intent/?q=order-6-placed")
            assert intent_id("webhook", "order-6-placed", receiver + "?status=410") in found
            assert intent_id("webhook", "order-1-placed", receiver) not in found

            process.send_signal(signal.SIGINT)  # what Ctrl-C does
            assert process.wait(timeout=30) == 0
            output.wait_for(r"stopping: workers first")
            output.wait_for(r"\[workers\] .*stopped")
        finally:
            if process.poll() is None:
                process.kill()
    # Both children are gone with it: nothing listens on their ports any more.
    assert not listening(port)
    assert not listening(port + 1)


def test_the_example_project_passes_its_checks_and_has_every_migration(tmp_path: Path):
    env = {
        **environment(None),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "EXAMPLE_DATA_DIR": str(tmp_path),
    }
    manage = [sys.executable, str(MANAGE)]

    check = subprocess.run(
        [*manage, "check", "--fail-level", "WARNING"], env=env, capture_output=True, text=True
    )
    migrations = subprocess.run(
        [*manage, "makemigrations", "--check", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
    )

    assert check.returncode == 0, check.stdout + check.stderr
    assert migrations.returncode == 0, migrations.stdout + migrations.stderr
