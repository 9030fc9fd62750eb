#!/usr/bin/env python3
"""Run the README's quickstart as a newcomer would: ``python3 tests/quickstart.py``.

The README is the first code a user runs, so it is tested the way they meet it:
from the built wheel, in a fresh virtual environment that holds only what the
wheel declares, in a project made by ``django-admin startproject``. The code is
not copied here: every fenced block that follows a ``<!-- quickstart -->``
comment in README.md is used as written. A ``sh`` block's commands run in
order; a ``python`` block whose first line is ``# path/to/file.py`` replaces
that file (``# mysite/settings.py: add at the end`` appends to it). So the test
fails as soon as the README drifts from what works.

The README's partner is a view of the quickstart site itself, served by the
``python manage.py runserver`` line, which this script starts in the
background (``--noreload``, on a free port: the README's ``127.0.0.1:8000`` is
replaced by that address in every block) and stops at the end, as the reader
stops it with Ctrl-C. Nothing leaves the machine. Passing means what the README
promises a reader sees:

- the order's webhook reached the receiver once, keyed by the intent's id, and
  the first ``--drain``'s table counts it completed;
- the deliberate failure (a partner that is down) was logged with its
  traceback, counted retried by the second ``--drain``, and left pending with
  its error and traceback;
- the admin's list shows the first intent Completed and the second Pending with
  its error, and the failed intent's page shows its traceback.

``--wheel`` installs a wheel built already (``tests/run.py`` passes the one its
packaging stage built); without it the wheel is built with ``python -m build``
by ``--build-python`` (``.venv-build``'s if it exists).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".tmp" / "quickstart"
MARKER = "<!-- quickstart -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r"# ([\w./-]+\.py)(: add at the end)?\n")
README_EXTRAS = "aiohttp"
README_ADDRESS = "127.0.0.1:8000"  # runserver's default, which the README's settings name


def say(message: str) -> None:
    print(f"[quickstart] {message}", flush=True)


def readme_blocks(readme: Path) -> list[tuple[str, str]]:
    """The ``(language, code)`` of every block marked for the quickstart, in README order."""
    blocks = BLOCK.findall(readme.read_text())
    if not blocks:
        raise SystemExit(f"no block follows {MARKER!r} in {readme}: nothing to test")
    return blocks


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, echo it, and fail with its output if it fails."""
    say("$ " + shlex.join(cmd))
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        sys.stdout.write(done.stdout + done.stderr)
        raise SystemExit(f"exit {done.returncode}: {shlex.join(cmd)}")
    return done


def build_wheel(build_python: str, out: Path) -> Path:
    """Build the wheel the way a release does; the newest one in ``out`` is returned."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools would reuse stale modules
    run([build_python, "-m", "build", "--wheel", "-o", str(out), str(ROOT)], ROOT, dict(os.environ))
    return max(out.glob("django_intents-*.whl"), key=lambda path: path.stat().st_mtime)


def fresh_venv(python: str, wheel: Path) -> tuple[Path, dict[str, str]]:
    """A new virtual environment with the wheel and its aiohttp extra, and only what they declare."""
    venv = WORK / "venv"
    run([python, "-m", "venv", str(venv)], WORK, dict(os.environ))
    # What a user's shell has after `source venv/bin/activate`, and nothing of
    # this checkout: no PYTHONPATH, no settings module, a directory outside ROOT.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONHOME"}
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    # With the extra the README's install line names: its handler posts with aiohttp.
    requirement = f"{wheel}[{README_EXTRAS}]"
    run([*pip, "--disable-pip-version-check", requirement], WORK, env, timeout=300)
    return venv, env


def command(line: str, venv: Path) -> list[str] | None:
    """A README shell line as this venv runs it; ``None`` for a blank or comment line."""
    words = shlex.split(line, comments=True)
    if not words:
        return None
    if words[0] == "python":
        return [str(venv / "bin" / "python"), *words[1:]]
    if words[0] == "django-admin":
        return [str(venv / "bin" / "django-admin"), *words[1:]]
    raise SystemExit(f"the quickstart runs python and django-admin lines only, not: {line}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """The README's ``runserver``, left running in the background as the reader leaves it."""

    def __init__(self, cmd: list[str], address: str, cwd: Path, env: dict[str, str]) -> None:
        self.log = WORK / "runserver.log"
        say("$ " + shlex.join(cmd) + f"  (in the background, on {address}, --noreload)")
        # Unbuffered: the receiver's print reaches the log as it reaches a terminal.
        with self.log.open("w") as log:
            self.process = subprocess.Popen(  # noqa: S603 - the README's own command
                [*cmd, address, "--noreload"],
                cwd=cwd,
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        host, port = address.split(":")
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(
                        f"runserver did not answer on {address}:\n{self.output()}"
                    ) from None
                time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        """Ctrl-C, as the reader stops it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def quickstart(python: str, wheel: Path) -> None:
    """Follow the README in a new project; raise SystemExit on the first thing that fails."""
    shutil.rmtree(WORK, ignore_errors=True)
    project = WORK / "project"
    project.mkdir(parents=True)
    blocks = readme_blocks(ROOT / "README.md")
    venv, env = fresh_venv(python, wheel)
    address = f"127.0.0.1:{free_port()}"
    server: Server | None = None
    drains: list[subprocess.CompletedProcess[str]] = []
    try:
        for language, code in blocks:
            code = code.replace(README_ADDRESS, address)
            if language == "sh":
                for line in code.splitlines():
                    cmd = command(line, venv)
                    if cmd and cmd[1:3] == ["manage.py", "runserver"]:
                        server = Server(cmd, address, project, env)
                    elif cmd:
                        done = run(cmd, project, env)
                        if "run_intent_workers" in cmd:
                            drains.append(done)
                continue
            title = TITLE.match(code)
            if language != "python" or not title:
                raise SystemExit(
                    f"a quickstart block must be sh, or python titled '# file.py':\n{code}"
                )
            path = project / title.group(1)
            if title.group(2):
                say(f"append to {title.group(1)}")
                with path.open("a") as settings:
                    settings.write("\n" + code)
            else:
                say(f"write {title.group(1)}")
                path.write_text(code)
        if server is None:
            raise SystemExit("the quickstart never starts runserver: nothing receives the webhook")
        problems = check(venv, project, env, drains, server.output())
    finally:
        if server is not None:
            server.stop()
    if problems:
        raise SystemExit(
            "the quickstart did not end as the README says:\n- " + "\n- ".join(problems)
        )


def outcomes(stdout: str, kind: str) -> dict[str, int]:
    """The row of ``kind`` in the outcome table a ``--drain`` prints, by column."""
    lines = stdout.splitlines()
    header = next((line for line in lines if line.startswith("kind ")), None)
    row = next((line for line in lines if line.split()[:1] == [kind]), None)
    if header is None or row is None:
        return {}
    columns = re.split(r"\s{2,}", header.strip())[1:]
    return dict(zip(columns, map(int, row.split()[1:]), strict=True))


# Run in the quickstart's project: the intents as the database has them, and
# the admin's list and the failed intent's page as a superuser sees them.
PROBE = """
import json, re, django_intents
from django.contrib.auth.models import User
from django.test import Client
from django_intents.models import Intent
intents = list(Intent.objects.order_by("created_at").values(
    "id", "event_id", "target", "state", "attempts", "last_error", "last_traceback"))
user = User.objects.create_superuser("quickstart", "quickstart@example.com", "unused")
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(user)
listing = client.get("/admin/django_intents/intent/").content.decode()
table = re.search(r'<table id="result_list".*?</table>', listing, re.S)
rows = [" ".join(re.sub(r"<[^>]+>", " ", row).split())
        for row in re.findall(r"<tr[^>]*>.*?</tr>", table.group(0) if table else "", re.S)[1:]]
failed = [row["id"] for row in intents if row["state"] != "completed"]
page = client.get(f"/admin/django_intents/intent/{failed[0]}/change/").content.decode() if failed else ""
print(json.dumps({"file": django_intents.__file__, "intents": intents, "rows": rows,
                  "page_has_traceback": "Traceback (most recent call last)" in page}))
"""


def check(
    venv: Path,
    project: Path,
    env: dict[str, str],
    drains: list[subprocess.CompletedProcess[str]],
    received: str,
) -> list[str]:
    """What the README says the reader sees, as problems; none when all of it holds."""
    cmd = [str(venv / "bin" / "python"), "manage.py", "shell", "-c", PROBE]
    seen = json.loads(run(cmd, project, env).stdout.strip().splitlines()[-1])
    problems = []
    if not seen["file"].startswith(str(venv)):
        problems.append(f"django_intents came from {seen['file']}, not the installed wheel")
    intents = seen["intents"]
    if [(row["event_id"], row["state"], row["attempts"]) for row in intents] != [
        ("order-1-placed", "completed", 1),
        ("partner-down", "pending", 1),
    ]:
        found = [
            {k: row[k] for k in ("event_id", "state", "attempts", "last_error")} for row in intents
        ]
        return [*problems, f"expected the order's intent completed and a failed one, not {found}"]
    delivered, failed = intents
    if not delivered["target"].endswith("/partner/hooks"):
        problems.append(f"the order's webhook went to {delivered['target']}, not the receiver")
    deliveries = received.count("partner: order ")
    if deliveries != 1 or f"partner: order 1 received, key {delivered['id'][:12]}" not in received:
        problems.append(
            f"the receiver should print order 1 once, with its key; it printed:\n{received}"
        )
    if received.count('"POST /partner/hooks HTTP/1.1" 204') != 1:
        problems.append(f"runserver should log one POST answered 204; it logged:\n{received}")
    if "Cannot connect to host 127.0.0.1:9" not in failed["last_error"]:
        problems.append(f"the failure's last_error is {failed['last_error']!r}")
    if "shop/handlers.py" not in failed["last_traceback"]:
        problems.append(
            f"the failure's traceback does not reach the handler: {failed['last_traceback']!r}"
        )
    if len(drains) != 2:
        return [*problems, f"expected two runs of the workers, found {len(drains)}"]
    first, second = (outcomes(done.stdout, "webhook") for done in drains)
    if first.get("completed") != 1 or sum(first.values()) != 1:
        problems.append(f"the first --drain should count 1 completed: {drains[0].stdout}")
    if second.get("retried") != 1 or sum(second.values()) != 1:
        problems.append(f"the second --drain should count 1 retried: {drains[1].stdout}")
    if "Traceback (most recent call last)" not in drains[1].stderr:
        problems.append(f"the second --drain logged no traceback: {drains[1].stderr}")
    expected_rows = [f"{failed['id'][:12]} Pending", f"{delivered['id'][:12]} Completed"]
    if [" ".join(row.split()[:2]) for row in seen["rows"]] != expected_rows:
        problems.append(f"the admin's list should show {expected_rows}: {seen['rows']}")
    elif "ClientConnectorError" not in seen["rows"][0]:
        problems.append(f"the admin's list does not show the failure's error: {seen['rows'][0]}")
    if not seen["page_has_traceback"]:
        problems.append("the failed intent's admin page shows no traceback")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wheel", type=Path, help="install this wheel instead of building one")
    parser.add_argument("--python", default=sys.executable, help="the Python of the fresh venv")
    default_build = ROOT / ".venv-build" / "bin" / "python"
    parser.add_argument(
        "--build-python",
        default=str(default_build) if default_build.exists() else sys.executable,
        help="a Python with `build` installed (default: .venv-build's, else this one)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    wheel = args.wheel or build_wheel(args.build_python, WORK.parent / "quickstart-dist")
    quickstart(args.python, wheel.resolve())
    say(f"ok: the README's quickstart works from {wheel.name} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
