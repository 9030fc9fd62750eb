#!/usr/bin/env python3
"""Set up and run the django-intents test suite: ``python3 tests/run.py``.

Needs nothing but Python 3.11+. It creates a virtual environment per Django
version (``.venv`` for Django 5.2, ``.venv-django6`` for Django 6.x, which needs
Python 3.12+), installs the project with its development group, and runs the
suite once per database. SQLite always runs; PostgreSQL and MariaDB/MySQL run
when a server answers (settings in tests/settings.py, overridable with PGHOST,
MYSQL_HOST, ...). Anything skipped is said at the end. ``--require-all`` (CI)
turns every skip into a failure.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET  # noqa: S405 - parses pytest's own report
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DJANGO = {
    "5.2": ("Django>=5.2,<5.3", ".venv", (3, 11)),
    "6": ("Django>=6.0,<7", ".venv-django6", (3, 12)),
}
DATABASES = {
    "sqlite": None,
    "postgresql": ("PGHOST", "127.0.0.1", "PGPORT", 5432),
    "mysql": ("MYSQL_HOST", "127.0.0.1", "MYSQL_PORT", 3306),
}


def say(message: str) -> None:
    print(f"[tests/run] {message}", flush=True)


def find_python(minimum: tuple[int, int]) -> str | None:
    """A Python interpreter at least ``minimum``: this one, python3.N on PATH, or pyenv's."""
    if sys.version_info[:2] >= minimum:
        return sys.executable
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates: list[str | None] = []
    for minor in range(minimum[1], 15):
        candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.{minor}.*/bin/python3"))
        candidates.append(shutil.which(f"python3.{minor}"))
    for candidate in filter(None, candidates):
        # pyenv shims exist for versions that are not active; only a real run tells.
        probe = [candidate, "-c", f"import sys; assert sys.version_info >= {minimum}"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return candidate
    return None


def mysql_headers_present() -> bool:
    pkg = shutil.which("pkg-config")
    if pkg:
        for name in ("mysqlclient", "mariadb", "libmariadb"):
            if subprocess.run([pkg, "--exists", name], check=False).returncode == 0:
                return True
    return bool(shutil.which("mysql_config") or shutil.which("mariadb_config"))


def setup_venv(version: str, python: str, with_mysql: bool) -> Path:
    spec, name, _ = DJANGO[version]
    venv = ROOT / name
    stamp = venv / ".intents-installed"
    wanted = f"{spec} mysql={with_mysql} {(ROOT / 'pyproject.toml').stat().st_mtime}"
    if stamp.exists() and stamp.read_text() == wanted:
        return venv
    say(f"setting up {name} ({spec}) with {python}")
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, "--upgrade", "pip>=25.1"], check=True)
    extras = "postgres,mysql" if with_mysql else "postgres"
    subprocess.run([*pip, "-e", f".[{extras}]", "--group", "dev", spec], check=True, cwd=ROOT)
    stamp.write_text(wanted)
    return venv


def reachable(vendor: str, venv: Path) -> str | None:
    """None if ``vendor`` can be tested here, else why not."""
    spec = DATABASES[vendor]
    if spec is None:
        return None
    host_var, host, port_var, port = spec
    host, port = os.environ.get(host_var, host), int(os.environ.get(port_var, port))
    if (
        vendor == "mysql"
        and subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import MySQLdb"], capture_output=True, check=False
        ).returncode
    ):
        return "mysqlclient is not installed (needs the MariaDB/MySQL client headers)"
    for _ in range(30 if os.environ.get("CI") else 1):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return None
        except OSError:
            time.sleep(1)
    return f"no server at {host}:{port}"


def run(cmd: list[str], env: dict[str, str] | None = None) -> int:
    say("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def static_checks(venv: Path) -> list[str]:
    py = str(venv / "bin" / "python")
    failures = []
    if run([str(venv / "bin" / "ruff"), "check", "."]):
        failures.append("ruff check")
    if run([str(venv / "bin" / "ruff"), "format", "--check", "."]):
        failures.append("ruff format")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "INTENTS_TEST_DB": "sqlite"}
    if run([py, "-m", "django", "check", "--fail-level", "WARNING"], env):
        failures.append("manage.py check")
    if run([py, "-m", "django", "makemigrations", "--check", "--dry-run"], env):
        failures.append("makemigrations --check")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--django", choices=["5.2", "6", "all"], default="5.2")
    parser.add_argument("--db", default="all", help="comma-separated: sqlite,postgresql,mysql")
    parser.add_argument("--require-all", action="store_true", help="fail instead of skipping (CI)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    vendors = list(DATABASES) if args.db == "all" else args.db.split(",")
    versions = ["5.2", "6"] if args.django == "all" else [args.django]
    with_mysql = "mysql" in vendors and (mysql_headers_present() or args.require_all)

    results: list[tuple[str, str]] = []
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    failed = skipped = False
    for version in versions:
        python = find_python(DJANGO[version][2])
        if python is None:
            results.append((f"Django {version}", "skipped: no Python 3.12+ found"))
            skipped = True
            continue
        venv = setup_venv(version, python, with_mysql)
        if version == versions[0]:
            problems = static_checks(venv)
            results.append(
                ("static checks", "failed: " + ", ".join(problems) if problems else "ok")
            )
            failed |= bool(problems)
        for vendor in vendors:
            label = f"Django {version} / {vendor}"
            why = reachable(vendor, venv)
            if why:
                results.append((label, f"skipped: {why}"))
                skipped = True
                continue
            env = {**os.environ, "INTENTS_TEST_DB": vendor}
            report = ROOT / ".tmp" / f"junit-{version}-{vendor}.xml"
            report.unlink(missing_ok=True)
            pytest = [str(venv / "bin" / "python"), "-m", "pytest", "-q", f"--junit-xml={report}"]
            code = run([*pytest, *args.pytest_args], env)
            counts = junit_counts(report)
            for key in totals:
                totals[key] += counts[key]
            summary = (
                f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
            )
            results.append(
                (label, summary if code == 0 else f"FAILED (pytest exit {code}): {summary}")
            )
            failed |= code != 0
        if version == "6":
            outcome = django_task_suite(venv)
            results.append(("Django's tests/tasks", outcome))
            failed |= outcome.startswith("FAILED")
            skipped |= outcome.startswith("skipped")

    print("\n" + "=" * 60)
    for label, outcome in results:
        print(f"  {label:<28} {outcome}")
    if skipped:
        message = "some databases or Django versions were skipped (see above)"
        if args.require_all:
            print(f"  ERROR: {message}; --require-all makes that a failure")
            failed = True
        else:
            print(f"  note: {message}; start the servers to test them too")
    print("=" * 60)
    print(
        f"total: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped"
    )
    return 1 if failed else 0


def django_task_suite(venv: Path) -> str:
    """Run Django's own task tests against IntentsBackend (tests/django_task_suite.py).

    The script downloads the Django sdist once; without network it reports
    itself skipped (exit 77), which ``--require-all`` turns into a failure.
    """
    script = [
        sys.executable,
        "tests/django_task_suite.py",
        "--python",
        str(venv / "bin" / "python"),
    ]
    say("$ " + " ".join(script))
    done = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, check=False)
    print(done.stdout + done.stderr, end="", flush=True)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    summary = last.split(": ", 1)[-1]
    if done.returncode == 77:
        return summary  # "skipped: <why>"
    return summary if done.returncode == 0 else f"FAILED (exit {done.returncode}): {summary}"


def junit_counts(report: Path) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    if not report.exists():
        return counts
    for suite in ET.parse(report).getroot().iter("testsuite"):  # noqa: S314
        tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        counts["failed"] += bad
        counts["skipped"] += skipped
        counts["passed"] += tests - skipped - bad
    return counts


if __name__ == "__main__":
    sys.exit(main())
