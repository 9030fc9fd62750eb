#!/usr/bin/env python3
"""Set up and run the example shop: ``python3 example_project/run.py``.

Needs nothing but Python 3.11+. On the first run it creates ``.venv`` (the one
``tests/run.py`` uses too) and installs the project into it, with the ``tasks``
extra (the ``django.tasks`` backport on Django 5.2; harmless on 6) and the
``aiohttp`` extra (the HTTP client of the shop's async webhook handler); then,
every time, it migrates the database (SQLite in ``--dir`` unless ``DATABASE_URL`` says
``postgres://...`` or ``mysql://...``), makes sure the superuser admin/admin
exists, places a few sample orders (some to a flaky partner, so retries and a
cancellation can be watched) and runs the site and a worker pool side by side,
printing where to look and how the intents progress. Ctrl-C stops both.

``--drain`` is the variant for scripts: the same set-up, the site in the
background (its receiver plays the partner), ``run_intent_workers --drain``
until no intent is left pending, then a table of intents per state; exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any, ClassVar
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
MANAGE = ROOT / "manage.py"
MINIMUM_PYTHON = (3, 11)
STATES = ("pending", "running", "completed", "cancelled")
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin"  # seed_shop creates this account
PROGRESS_EVERY = 2.0  # seconds between two looks at the queue
STOP_GRACE = 20.0  # seconds a child has to exit after SIGTERM before it is killed

_print_lock = threading.Lock()


def say(message: str, prefix: str = "example") -> None:
    with _print_lock:
        sys.stdout.write(f"[{prefix}] {message}\n")
        sys.stdout.flush()


# -- the environment ---------------------------------------------------------------------


def ensure_python_version() -> None:
    """Re-run this script with a newer Python found on PATH if this one is too old."""
    if sys.version_info >= MINIMUM_PYTHON:
        return
    for minor in range(14, MINIMUM_PYTHON[1] - 1, -1):
        candidate = shutil.which(f"python3.{minor}")
        if candidate:
            os.execv(candidate, [candidate, __file__, *sys.argv[1:]])  # noqa: S606
    sys.exit(f"django-intents needs Python {'.'.join(map(str, MINIMUM_PYTHON))}+; found none")


def driver(database_url: str) -> tuple[str | None, str | None]:
    """The pip extra and the module the database in ``DATABASE_URL`` needs."""
    scheme = urlsplit(database_url).scheme
    if scheme in ("postgres", "postgresql", "pgsql"):
        return "postgres", "psycopg"
    if scheme in ("mysql", "mariadb"):
        return "mysql", "MySQLdb"
    return None, None


def imports(python: str | Path, modules: list[str]) -> bool:
    probe = [str(python), "-c", "import " + ", ".join(modules)]
    return subprocess.run(probe, cwd=ROOT, capture_output=True, check=False).returncode == 0  # noqa: S603


def ensure_environment(database_url: str) -> str:
    """The interpreter to run the shop with, after creating and filling ``.venv`` if needed.

    Inside a virtual environment that already has everything (an activated
    ``.venv``, the test suite's interpreter) that environment is used as it is,
    so tests and repeated runs never touch pip.
    """
    extra, module = driver(database_url)
    # django_intents.tasks imports only with a task framework: Django 6's own, or
    # on Django 5.2 the django-tasks backport that the "tasks" extra installs.
    # aiohttp: the shop's webhook handler is async and posts with it.
    needed = ["django", "django_prometheus", "django_intents.tasks", "aiohttp"]
    needed += [module] if module else []
    if sys.prefix != sys.base_prefix and imports(sys.executable, needed):
        return sys.executable
    python = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        say(f"creating {VENV} with Python {sys.version.split()[0]}")
        created = subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=False)  # noqa: S603
        if created.returncode:
            sys.exit("could not create .venv; on Debian or Ubuntu, install python3-venv first")
    if not imports(python, needed):
        spec = f".[tasks,aiohttp,{extra}]" if extra else ".[tasks,aiohttp]"
        say(f"installing django-intents ({spec}) into {VENV.name}; the first time takes a minute")
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if subprocess.run([*pip, "-e", spec], cwd=ROOT, check=False).returncode:  # noqa: S603
            hint = " (mysqlclient needs the MariaDB client headers)" if extra == "mysql" else ""
            sys.exit(f"pip could not install {spec}{hint}")
    return str(python)


# -- child processes ---------------------------------------------------------------------


class Child:
    """A subprocess in its own session whose output is printed line by line with a prefix.

    Its own session keeps Ctrl-C away from it: the terminal signals this script
    only, and :meth:`stop` forwards one SIGTERM. A worker pool that got the
    terminal's SIGINT and then our SIGTERM would read the second signal as
    "exit now" and skip its graceful shutdown.
    """

    alive: ClassVar[set[Child]] = set()

    def __init__(
        self, name: str, command: list[str], env: dict[str, str], *, own_session: bool = True
    ) -> None:
        self.name = name
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=own_session,
        )
        self.pump = threading.Thread(target=self._print, args=(self.process.stdout,), daemon=True)
        self.pump.start()
        Child.alive.add(self)

    def _print(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            say(line.rstrip(), self.name)

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, stop: threading.Event) -> int:
        """Wait for the child to exit by itself; stop it if ``stop`` is set meanwhile."""
        while self.running():
            if stop.wait(0.2):
                return self.stop()
        return self.finish()

    def stop(self, grace: float = STOP_GRACE) -> int:
        if self.running():
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                say(f"{self.name} did not stop within {grace:.0f} s; killing it")
                self.process.kill()
        return self.finish()

    def finish(self) -> int:
        code = self.process.wait()
        self.pump.join(timeout=2)
        Child.alive.discard(self)
        return code


def run_step(name: str, command: list[str], env: dict[str, str]) -> None:
    # Set-up steps stay in our process group: Ctrl-C interrupts them with us.
    code = Child(name, command, env, own_session=False).finish()
    if code:
        sys.exit(f"{' '.join(command[2:])} failed (exit {code}); see above")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers will: connections of a previous run that linger in
        # TIME_WAIT do not make the port busy, a listening server does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def fetch_status(site: str) -> dict[str, Any] | None:
    """The shop's ``/status/`` JSON: intents per kind and state, next due time, receiver counts."""
    try:
        with urllib.request.urlopen(site + "status/", timeout=5) as response:  # noqa: S310
            result: dict[str, Any] = json.load(response)
            return result
    except (OSError, ValueError):
        return None


def wait_until_up(
    site: str, web: Child, stop: threading.Event, timeout: float = 30
) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while web.running() and not stop.is_set() and time.monotonic() < deadline:
        status = fetch_status(site)
        if status is not None:
            return status
        time.sleep(0.2)
    return None


def totals(status: dict[str, Any]) -> dict[str, int]:
    by_kind: dict[str, dict[str, int]] = status["intents"]
    return {state: sum(counts.get(state, 0) for counts in by_kind.values()) for state in STATES}


def progress(status: dict[str, Any]) -> str:
    counts = totals(status)
    line = "intents: " + ", ".join(f"{counts[state]} {state}" for state in STATES)
    line += (
        f"  |  receiver stored {status['webhooks_stored']} webhooks, "
        f"{status['pushes_sent']} pushes sent, {status['receipts_sent']} receipts sent"
    )
    if counts["pending"] and status["next_due_in"]:
        line += f"  |  next retry in {status['next_due_in']:.1f} s"
    elif not counts["pending"] and not counts["running"]:
        line += "  |  all done; place another order on the site"
    return line


def summary(status: dict[str, Any]) -> str:
    """A table of intents per kind and state, with a total row."""
    rows = [
        (kind, [counts.get(state, 0) for state in STATES])
        for kind, counts in status["intents"].items()
    ]
    rows.append(("all", [sum(row[1][i] for row in rows) for i in range(len(STATES))]))
    width = max(10, *(len(kind) + 2 for kind, _ in rows))  # room for "django.tasks"
    header = f"{'kind':<{width}}" + "".join(f"{state:>11}" for state in STATES) + f"{'total':>8}"
    lines = [header, "-" * len(header)]
    lines += [
        f"{kind:<{width}}" + "".join(f"{n:>11}" for n in ns) + f"{sum(ns):>8}" for kind, ns in rows
    ]
    duplicates = status["webhook_deliveries"] - status["webhooks_stored"]
    lines.append(
        f"receiver: {status['webhooks_stored']} webhooks stored, "
        f"{duplicates} duplicate deliveries ignored; {status['pushes_sent']} pushes sent, "
        f"{status['receipts_sent']} receipts sent"
    )
    return "\n".join(lines)


# -- the two modes -----------------------------------------------------------------------


def runserver(manage: list[str], port: int) -> list[str]:
    # No autoreloader: it would fork a second server that Ctrl-C handling cannot see.
    return [*manage, "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"]


def serve(
    manage: list[str], env: dict[str, str], args: argparse.Namespace, stop: threading.Event
) -> int:
    site = f"http://127.0.0.1:{args.port}/"
    metrics_port = args.port + 1
    web = Child("web", runserver(manage, args.port), env)
    if wait_until_up(site, web, stop) is None:
        web.stop()
        if stop.is_set():
            return 0
        say("the site did not come up; see its output above")
        return 1
    workers = Child(
        "workers",
        [
            *manage,
            "run_intent_workers",
            "--workers",
            str(args.workers),
            "--metrics-port",
            str(metrics_port),
        ],
        env,
    )
    say("the shop is running:")
    say(f"  site     {site}   place orders, watch their intents")
    say(f"  admin    {site}admin/   user {ADMIN_USER!r}, password {ADMIN_PASSWORD!r}")
    say(f"  intents  {site}admin/django_intents/intent/")
    say(f"  metrics  {site}metrics (site)   http://127.0.0.1:{metrics_port}/metrics (workers)")
    say("Ctrl-C stops the site and the workers.")

    code, last = 0, ""
    while not stop.wait(PROGRESS_EVERY):
        dead = [child for child in (web, workers) if not child.running()]
        if dead:
            say(f"{dead[0].name} exited with code {dead[0].process.returncode}; stopping")
            code = 1
            break
        status = fetch_status(site)
        line = progress(status) if status else "the site does not answer"
        if line != last:
            say(line)
            last = line
    say("stopping: workers first (they finish or release what they hold), then the site")
    workers.stop()
    web.stop()
    return code


def drain(
    manage: list[str], env: dict[str, str], args: argparse.Namespace, stop: threading.Event
) -> int:
    site = f"http://127.0.0.1:{args.port}/"
    started = time.monotonic()
    web = Child("web", runserver(manage, args.port), env)
    try:
        status = wait_until_up(site, web, stop)
        if stop.is_set():
            say("interrupted")
            return 130
        if status is None:
            say("the site did not come up; see its output above")
            return 1
        rounds = 0
        while True:
            rounds += 1
            workers = Child(
                "workers",
                [*manage, "run_intent_workers", "--drain", "--workers", str(args.workers)],
                env,
            )
            code = workers.wait(stop)
            if stop.is_set():
                say("interrupted")
                return 130
            if code:
                say(f"run_intent_workers --drain exited with code {code}")
                return 1
            status = fetch_status(site)
            if status is None:
                say("the site stopped answering")
                return 1
            counts = totals(status)
            waiting = counts["pending"] + counts["running"]
            if not waiting:
                break
            left = args.timeout - (time.monotonic() - started)
            if left <= 0:
                say(f"timed out after {args.timeout:.0f} s with {waiting} intents unfinished")
                print(summary(status), flush=True)
                return 1
            pause = min(max(status["next_due_in"] or 0.0, 0.2), left)
            say(f"{waiting} intent(s) wait for a retry; draining again in {pause:.1f} s")
            if stop.wait(pause):
                say("interrupted")
                return 130
        say(f"drained in {time.monotonic() - started:.1f} s, {rounds} worker run(s):")
        print(summary(status), flush=True)
        return 0
    finally:
        web.stop()


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError(value)
    return number


def main() -> int:
    ensure_python_version()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--drain", action="store_true", help="process every intent, print a summary, exit"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the site's port (the workers' metrics use the next one)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=ROOT / ".tmp" / "example",
        help="where the SQLite database lives",
    )
    parser.add_argument("--workers", type=positive, default=4, help="concurrent workers")
    parser.add_argument(
        "--fail",
        type=fraction,
        default="0.5",
        help="fraction of deliveries the flaky sample partner refuses (0 to 1)",
    )
    parser.add_argument(
        "--timeout", type=float, default=120, help="--drain gives up after this many seconds"
    )
    args = parser.parse_args()

    database_url = os.environ.get("DATABASE_URL", "")
    for port in (args.port,) if args.drain else (args.port, args.port + 1):
        if not port_is_free(port):
            say(f"port {port} is in use; pick another with --port")
            return 2
    python = ensure_environment(database_url)
    args.dir = args.dir.resolve()
    env = {
        **os.environ,
        # Forced, not defaulted: a DJANGO_SETTINGS_MODULE inherited from the caller
        # (a test run, another project's shell) must not point the shop elsewhere.
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "EXAMPLE_DATA_DIR": str(args.dir),
        "PYTHONUNBUFFERED": "1",
    }
    if database_url:
        parts = urlsplit(database_url)
        where = f"{parts.hostname}:{parts.port or ''}{parts.path}"
        say(f"database: {parts.scheme} at {where} (DATABASE_URL)")
    else:
        say(f"database: SQLite at {args.dir / 'example.sqlite3'}")
    manage = [python, str(MANAGE)]
    say("migrating the database")
    run_step("migrate", [*manage, "migrate", "--noinput", "-v", "0"], env)
    site = f"http://127.0.0.1:{args.port}"
    run_step("seed", [*manage, "seed_shop", "--site", site, "--fail", str(args.fail)], env)

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set():
            # A second Ctrl-C: pass it on. The pool reads a second SIGTERM as
            # "release what still runs and exit now".
            for child in list(Child.alive):
                if child.running():
                    child.process.terminate()
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    return (drain if args.drain else serve)(manage, env, args, stop)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # during set-up, before our own handler is installed
        sys.exit(130)
