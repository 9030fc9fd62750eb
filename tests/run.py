#!/usr/bin/env python3
"""Set up and run the django-intents test suite: ``python3 tests/run.py``.

Needs nothing but Python 3.11+. It creates a virtual environment per Django
version (``.venv`` for Django 5.2, ``.venv-django6`` for Django 6.x, which needs
Python 3.12+), installs the project with its development group, and runs the
suite once per database. SQLite always runs; PostgreSQL and MariaDB/MySQL run
when a server answers (settings in tests/settings.py, overridable with PGHOST,
MYSQL_HOST, ...), and the store and worker tests run again through PgBouncer
in transaction mode when one answers on port 6432 (``tests/pgbouncer/start``). ``tests/test_shards.py``, which needs two databases, runs in suites of its own ("shards": SQLite twice, PostgreSQL twice, PostgreSQL with SQLite, MariaDB twice), once per run. Then, once per run, the stages a user meets before the code:
``packaging`` (build the sdist and wheel, ``twine check``, list the wheel),
``quickstart`` (the README's quickstart from that wheel in a fresh venv,
tests/quickstart.py) and ``docs`` (the site, ``mkdocs build --strict``), with
their tools in ``.venv-build`` and ``.venv-docs``, never in ``.venv``.
``--only packaging,docs`` picks stages (``tests`` is the suite). Anything
skipped is said at the end, with the reason. ``--require-all`` (CI) turns every
skip into a failure. ``--jobs 2`` runs two suites at once, each on a test
database of its own, and shows each one's output when it ends.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET  # noqa: S405 - parses pytest's own report
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DJANGO = {
    "5.2": ("Django>=5.2,<5.3", ".venv", (3, 11)),
    "6": ("Django>=6.0,<7", ".venv-django6", (3, 12)),
}
MYSQL_HEADERS_HINT = (
    "it compiles against the MariaDB/MySQL client headers; install them "
    "(Debian/Ubuntu: apt-get install libmariadb-dev pkg-config; "
    "macOS: brew install mysql-client pkg-config, and PKG_CONFIG_PATH set to "
    "$(brew --prefix)/opt/mysql-client/lib/pkgconfig), then run this again"
)
# Tools of the once-per-run stages, each in its own venv so .venv stays what
# the suite needs; ranges wide enough for fixes, narrow enough that a major
# release cannot break CI overnight.
TOOL_VENVS = {
    ".venv-build": ["build>=1.2,<2", "twine>=6.1,<8", "setuptools>=77,<81"],
    ".venv-docs": [
        "mkdocs>=1.6,<2",
        "mkdocs-material>=9.5,<10",
        "mkdocstrings>=1.0,<2",
        "mkdocstrings-python>=2.0,<3",
        "ruff>=0.17,<0.18",  # mkdocstrings formats long signatures with it
    ],
}
# What the wheel must carry besides modules: without them the admin has no
# templates or CSS, type checkers ignore the package, and migrate has nothing.
WHEEL_MUST_HOLD = [
    "django_intents/py.typed",
    "django_intents/static/django_intents/admin.css",
    "django_intents/templates/admin/django_intents/intent/change_form.html",
    "django_intents/templates/admin/django_intents/intent/change_list.html",
    "django_intents/templates/admin/django_intents/intent/summary.html",
    "django_intents/migrations/0001_initial.py",
]
# PyPI shows these beside the description, and the README links to nothing else
# the wheel does not carry: a relative link or image there leads nowhere on PyPI.
PROJECT_URLS = ("Homepage", "Documentation", "Changelog", "Issues")
RELATIVE_TARGET = re.compile(r"\]\((?!https?://|#)[^)\s]+\)|<img\s[^>]*src=\"(?!https?://)[^\"]*\"")
STAGES = ("tests", "packaging", "quickstart", "docs")
DATABASES = {
    "sqlite": None,
    "postgresql": ("PGHOST", "127.0.0.1", "PGPORT", 5432),
    "pgbouncer": ("PGBOUNCER_HOST", "127.0.0.1", "PGBOUNCER_PORT", 6432),
    "mysql": ("MYSQL_HOST", "127.0.0.1", "MYSQL_PORT", 3306),
}
# What runs through PgBouncer: the store and the worker, where a pooler in
# transaction mode changes what a connection can hold (sessions, LISTEN,
# prepared statements). The admin, docs and examples would only repeat the
# PostgreSQL run; tests/test_worker_connections.py counts the server's
# connections, which behind a pooler are the pooler's.
POOLED_SUITE = [
    "tests/test_enqueue.py",
    "tests/test_claim.py",
    "tests/test_transitions.py",
    "tests/test_batch.py",
    "tests/test_concurrency.py",
    "tests/test_limits.py",
    "tests/test_priority.py",
    "tests/test_pause.py",
    "tests/test_clock.py",
    "tests/test_clock_process.py",
    "tests/test_listen_database.py",
    "tests/test_worker_pool.py",
    "tests/test_worker_process.py",
    "tests/test_worker_async.py",
]
# Several databases in one process (issue 41): tests/test_shards.py with a second
# alias, "shard", of the vendor named second. Once per run, with the newest Django.
SHARD_PAIRS = [
    ("sqlite", "sqlite"),
    ("postgresql", "postgresql"),
    ("postgresql", "sqlite"),
    ("mysql", "mysql"),
]
SHARD_SUITE = ["tests/test_shards.py"]


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


def pip_install(venv: Path) -> list[str]:
    """``pip install``, quietly, with ``venv``'s own interpreter."""
    return [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]


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
    pip = pip_install(venv)
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
        return f"mysqlclient is not installed: {MYSQL_HEADERS_HINT}"
    for _ in range(30 if os.environ.get("CI") else 1):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return None
        except OSError:
            time.sleep(1)
    if vendor == "pgbouncer":
        return f"no PgBouncer at {host}:{port} (tests/pgbouncer/start starts one)"
    return f"no server at {host}:{port}"


def run(cmd: list[str], env: dict[str, str] | None = None) -> int:
    say("$ " + " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def run_quietly(cmd: list[str]) -> int:
    """``run``, with the command's output shown only if it fails.

    A build's hundreds of lines of setuptools progress would bury the results;
    when it fails, they are what says why.
    """
    say("$ " + " ".join(cmd))
    done = subprocess.run(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if done.returncode:
        print(done.stdout, end="", flush=True)
    return done.returncode


def static_checks(venv: Path) -> list[str]:
    py = str(venv / "bin" / "python")
    failures = []
    if run([str(venv / "bin" / "ruff"), "check", "."]):
        failures.append("ruff check")
    if run([str(venv / "bin" / "ruff"), "format", "--check", "."]):
        failures.append("ruff format")
    if run([str(venv / "bin" / "lint-imports")]):
        failures.append("lint-imports")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "INTENTS_TEST_DB": "sqlite"}
    # Strict, over the package and its migrations ([tool.mypy] in pyproject.toml).
    if run([py, "-m", "mypy"], env):
        failures.append("mypy")
    if run([py, "-m", "django", "check", "--fail-level", "WARNING"], env):
        failures.append("manage.py check")
    if run([py, "-m", "django", "makemigrations", "--check", "--dry-run"], env):
        failures.append("makemigrations --check")
    return failures


def stage_list(value: str) -> set[str]:
    """``--only``: a comma-separated subset of ``STAGES``."""
    chosen = {name.strip() for name in value.split(",") if name.strip()}
    unknown = chosen - set(STAGES)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {','.join(STAGES)}, not {value!r}")
    return chosen


@dataclass
class Suite:
    """One pytest run of the matrix: a Django version against a database."""

    label: str
    command: list[str]
    env: dict[str, str]
    report: Path
    seconds: int  # expected alone: a parallel run starts the longest first


# Seconds a suite took alone on the 2-core CI machine (Django 5.2, 2026-12-03):
# a parallel run starts the longest first, so the two lanes end together.
SUITE_SECONDS = {"postgresql": 250, "mysql": 185, "sqlite": 165, "pgbouncer": 120}
SOAK_SECONDS = 40  # tests/test_chaos.py, in the last Django version's suites


def run_suite(suite: Suite, log: Path | None) -> tuple[int, float]:
    """Run ``suite``, its output to the terminal or, in a parallel run, to ``log``."""
    suite.report.unlink(missing_ok=True)
    started = time.monotonic()
    if log is None:
        code = run(suite.command, suite.env)
    else:
        with log.open("w") as out:
            done = subprocess.run(
                suite.command, cwd=ROOT, env=suite.env, stdout=out, stderr=subprocess.STDOUT
            )
        code = done.returncode
    return code, time.monotonic() - started


def run_suites(suites: list[Suite], jobs: int) -> dict[str, tuple[int, float]]:
    """Run the suites, ``jobs`` at a time; their exit codes and seconds by label.

    A suite waits on subprocesses, leases and sockets far more than it
    computes (a third of two cores, measured), so two at a time take little
    more than the longer of them. Each has its own test database
    (``INTENTS_TEST_DB_SUFFIX``), and its output is shown whole when it ends.
    """
    if jobs <= 1:
        return {suite.label: run_suite(suite, None) for suite in suites}
    outcomes: dict[str, tuple[int, float]] = {}
    lock = threading.Lock()

    def one(suite: Suite) -> None:
        log = suite.report.with_suffix(".log")
        say(f"started {suite.label}: " + " ".join(suite.command))
        outcome = run_suite(suite, log)
        with lock:
            print(log.read_text(), end="", flush=True)
            say(f"finished {suite.label} in {outcome[1]:.0f} s (exit {outcome[0]})")
            outcomes[suite.label] = outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, sorted(suites, key=lambda suite: -suite.seconds)))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--django", choices=["5.2", "6", "all"], default="5.2")
    parser.add_argument(
        "--db", default="all", help="comma-separated: sqlite,postgresql,pgbouncer,mysql"
    )
    parser.add_argument("--require-all", action="store_true", help="fail instead of skipping (CI)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="suites run at once, each on its own test database (CI: 2); default 1",
    )
    parser.add_argument(
        "--only",
        type=stage_list,
        default=set(STAGES),
        help=f"comma-separated stages to run, of {','.join(STAGES)} (default: all)",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be 1 or more, not {args.jobs}")
    vendors = list(DATABASES) if args.db == "all" else args.db.split(",")
    versions = ["5.2", "6"] if args.django == "all" else [args.django]
    if "tests" not in args.only:
        versions = []
    with_mysql = "mysql" in vendors and (mysql_headers_present() or args.require_all)

    results: list[tuple[str, str]] = []
    suites: list[Suite] = []
    venvs: dict[str, Path] = {}
    failed = skipped = False
    for version in versions:
        python = find_python(DJANGO[version][2])
        if python is None:
            results.append((f"Django {version}", "skipped: no Python 3.12+ found"))
            skipped = True
            continue
        venv = venvs[version] = setup_venv(version, python, with_mysql)
        if version == versions[0]:
            problems = static_checks(venv)
            results.append(
                ("static checks", "failed: " + ", ".join(problems) if problems else "ok")
            )
            failed |= bool(problems)
        last = version == versions[-1]
        for vendor in vendors:
            label = f"Django {version} / {vendor}"
            if vendor == "pgbouncer" and not last:
                # The pooler's run repeats the store and worker tests; once per run
                # is enough, with the newest Django version (CI's time is bounded).
                results.append((label, f"not run here: once per run, with Django {versions[-1]}"))
                continue
            why = reachable(vendor, venv)
            if why:
                results.append((label, f"skipped: {why}"))
                skipped = True
                continue
            env = {**os.environ, "INTENTS_TEST_DB": vendor}
            if args.jobs > 1:  # each suite on its own database: test_django_intents_6_mysql
                env["INTENTS_TEST_DB_SUFFIX"] = f"_{version.replace('.', '')}_{vendor}"
            if not last:  # the chaos soak runs once per run too (tests/test_chaos.py)
                env["INTENTS_TEST_SOAK"] = "0"
            report = ROOT / ".tmp" / f"junit-{version}-{vendor}.xml"
            pytest = [str(venv / "bin" / "python"), "-m", "pytest", "-q", f"--junit-xml={report}"]
            if args.jobs > 1:  # pytest's numbered temp dirs are not shared safely
                pytest.append(f"--basetemp={ROOT / '.tmp' / f'pytest-{version}-{vendor}'}")
            chosen = POOLED_SUITE if vendor == "pgbouncer" and not args.pytest_args else []
            command = [*pytest, *chosen, *args.pytest_args]
            seconds = SUITE_SECONDS[vendor] + (SOAK_SECONDS if last else 0)
            suites.append(Suite(label, command, env, report, seconds))
            results.append((label, "not run"))
        for first, second in SHARD_PAIRS if last else []:
            label = f"Django {version} / shards {first}+{second}"
            if first not in vendors or second not in vendors:
                continue
            why = reachable(first, venv) or reachable(second, venv)
            if why:
                results.append((label, f"skipped: {why}"))
                skipped = True
                continue
            env = {**os.environ, "INTENTS_TEST_DB": first, "INTENTS_TEST_SHARD": second}
            env["INTENTS_TEST_DB_SUFFIX"] = f"_{version.replace('.', '')}_shards_{second}"
            report = ROOT / ".tmp" / f"junit-{version}-shards-{first}-{second}.xml"
            pytest = [str(venv / "bin" / "python"), "-m", "pytest", "-q", f"--junit-xml={report}"]
            pytest.append(f"--basetemp={ROOT / '.tmp' / f'pytest-{version}-shards-{second}'}")
            command = [*pytest, *(args.pytest_args or SHARD_SUITE)]
            suites.append(Suite(label, command, env, report, 30))
            results.append((label, "not run"))

    totals = {"passed": 0, "failed": 0, "skipped": 0}
    outcomes = run_suites(suites, args.jobs)
    for suite in suites:
        code, seconds = outcomes[suite.label]
        counts = junit_counts(suite.report)
        for key in totals:
            totals[key] += counts[key]
        summary = (
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        )
        summary += f" ({seconds:.0f} s)"
        outcome = summary if code == 0 else f"FAILED (pytest exit {code}): {summary}"
        results[results.index((suite.label, "not run"))] = (suite.label, outcome)
        failed |= code != 0
    if "6" in venvs:
        outcome = django_task_suite(venvs["6"])
        results.append(("Django's tests/tasks", outcome))
        failed |= outcome.startswith("FAILED")
        skipped |= outcome.startswith("skipped")

    for label, outcome in once_stages(args.only):
        results.append((label, outcome))
        failed |= outcome.startswith("FAILED")
        skipped |= outcome.startswith("skipped")

    print("\n" + "=" * 60)
    for label, outcome in results:
        print(f"  {label:<28} {outcome}")
    if skipped:
        message = "some stages, databases or Django versions were skipped"
        if args.require_all:
            print(f"  ERROR: {message}; --require-all makes that a failure")
            failed = True
        else:
            print(f"  note: {message}; the reasons are beside each line")
    print("=" * 60)
    if suites:
        # The last line, which CI reads; with no suite run (--only packaging,docs)
        # a total of "0 passed" would read as a suite that found nothing to run.
        print(
            f"total: {totals['passed']} passed, {totals['failed']} failed, "
            f"{totals['skipped']} skipped"
        )
    return 1 if failed else 0


def offline_reason(purpose: str) -> str | None:
    """None if the package index answers, else why ``purpose`` cannot be done (a laptop on a train)."""
    host = "pypi.org"
    if os.environ.get("PIP_INDEX_URL", "").startswith(("http://", "https://")):
        host = os.environ["PIP_INDEX_URL"].split("/")[2].rsplit("@", 1)[-1].split(":")[0]
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as exc:
        return f"no network {purpose} ({host}: {exc})"
    return None


def tool_venv(name: str) -> tuple[Path | None, str | None]:
    """The venv ``name`` of ``TOOL_VENVS``, made or updated; ``(None, why)`` if it cannot be."""
    venv, wanted = ROOT / name, " ".join(TOOL_VENVS[name])
    stamp = venv / ".intents-installed"
    if stamp.exists() and stamp.read_text() == wanted:
        return venv, None
    why = offline_reason(f"to set up {name}")
    if why:
        return None, why
    say(f"setting up {name}: {wanted}")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([*pip_install(venv), "--upgrade", *TOOL_VENVS[name]], check=True)
    stamp.write_text(wanted)
    return venv, None


def build_dist(venv: Path, out: Path) -> tuple[list[str], Path | None]:
    """Build the sdist and wheel into ``out``; return the problems and the wheel."""
    shutil.rmtree(out, ignore_errors=True)
    # setuptools copies modules into build/lib and never removes one: a module
    # deleted from the source would still ship from a stale copy.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    # --no-isolation: the backend comes from .venv-build, so a build needs no network.
    build = [str(venv / "bin" / "python"), "-m", "build", "--no-isolation", "-o", str(out), "."]
    if run_quietly(build):
        return ["python -m build (output above)"], None
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"expected one wheel and one sdist in {out}"], None
    return [], wheels[0]


def dist_problems(wheel: Path, sdist: Path) -> list[str]:
    """What the built files lack or carry by mistake, read from the archives themselves."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(
            archive.read(name).decode() for name in names if name.endswith(".dist-info/METADATA")
        )
    problems = [f"wheel lacks {name}" for name in WHEEL_MUST_HOLD if name not in names]
    problems += [
        f"wheel carries {name}" for name in names if name.startswith(("tests/", "example_project/"))
    ]
    if "Description-Content-Type: text/markdown" not in metadata:
        problems.append("METADATA does not say the README is Markdown")
    headers, _, description = metadata.partition("\n\n")
    problems += [
        f"METADATA has no Project-URL {name}"
        for name in PROJECT_URLS
        if f"Project-URL: {name}, https://" not in headers
    ]
    if "Provides-Extra: bench" in headers:
        problems.append("the benchmark peers are a public extra, not the bench group")
    problems += [
        f"the long description points at {found.group(0)}, which PyPI cannot follow"
        for found in RELATIVE_TARGET.finditer(description)
    ]
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[-1] for name in archive.getnames()}
    wanted = {"LICENSE", "CHANGELOG.md", "README.md", "tests/settings.py", "docs/reference.md"}
    problems += [f"sdist lacks {name}" for name in sorted(wanted - members)]
    return problems


def stage_packaging() -> tuple[str, Path | None]:
    """Build the sdist and wheel, ``twine check`` them, and list what the wheel holds."""
    venv, why = tool_venv(".venv-build")
    if venv is None:
        return f"skipped: {why}", None
    out = ROOT / ".tmp" / "dist"
    problems, wheel = build_dist(venv, out)
    if wheel is not None:
        if run(
            [str(venv / "bin" / "twine"), "check", "--strict", *map(str, sorted(out.iterdir()))]
        ):
            problems.append("twine check")
        problems += dist_problems(wheel, next(out.glob("*.tar.gz")))
        say(f"{wheel.name} holds: " + ", ".join(zipfile.ZipFile(wheel).namelist()))
    return ("FAILED: " + "; ".join(problems) if problems else "ok"), wheel


def stage_quickstart(wheel: Path | None) -> str:
    """Follow the README's quickstart from the wheel in a fresh venv (tests/quickstart.py)."""
    why = offline_reason("to install Django into a fresh venv, as a user would")
    if why:
        return f"skipped: {why}"
    if wheel is None:
        venv, why = tool_venv(".venv-build")
        if venv is None:
            return f"skipped: {why}"
        problems, wheel = build_dist(venv, ROOT / ".tmp" / "dist")
        if wheel is None:
            return "FAILED: " + "; ".join(problems)
    script = [sys.executable, "tests/quickstart.py", "--wheel", str(wheel)]
    return "FAILED: tests/quickstart.py (output above)" if run(script) else "ok"


def site_link_problems(site: Path) -> list[str]:
    """Links of the built pages that a browser on ``file://`` cannot follow to a page.

    The README says to open ``.tmp/site/index.html`` from disk, where a link
    to ``workers/`` shows a directory listing instead of the page: every
    relative link must name a file of the site. ``404.html`` is left out: a
    server shows it at any depth, so its links are absolute on purpose.
    """
    problems = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":
            continue
        for href in re.findall(r'(?:href|src)="([^"]+)"', page.read_text()):
            path = href.split("#", 1)[0]
            if not path or re.match(r"[a-z][a-z0-9+.-]*:", path):
                continue  # an anchor on the page, or another site
            target = (page.parent / path).resolve()
            if path.startswith("/") or not target.is_file():
                problems.append(f"{page.relative_to(site)} links to {href}")
    return problems


def stage_docs() -> str:
    """Build the documentation site into .tmp/site; any warning fails (--strict)."""
    venv, why = tool_venv(".venv-docs")
    if venv is None:
        return f"skipped: {why}"
    site = ROOT / ".tmp" / "site"
    mkdocs = [str(venv / "bin" / "mkdocs"), "build", "--strict", "--site-dir", str(site)]
    # Material's notice about its successor (docs/index.md, Contributing) is not a build result.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if run(mkdocs, env):
        return "FAILED: mkdocs build --strict (output above)"
    problems = site_link_problems(site)
    for problem in problems:
        say(problem)
    return f"FAILED: {len(problems)} links lead nowhere from file:// (above)" if problems else "ok"


def once_stages(stages: set[str]) -> list[tuple[str, str]]:
    """Run the stages that do not depend on a database or Django version, timed."""
    results: list[tuple[str, str]] = []
    wheel = None
    for name in ("packaging", "quickstart", "docs"):
        if name not in stages:
            continue
        started = time.monotonic()
        if name == "packaging":
            outcome, wheel = stage_packaging()
        elif name == "quickstart":
            outcome = stage_quickstart(wheel)
        else:
            outcome = stage_docs()
        if not outcome.startswith("skipped"):
            outcome += f" ({time.monotonic() - started:.0f} s)"
        results.append((name, outcome))
    return results


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
