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

The handler posts to ``PARTNER_WEBHOOK_URL``; here that is a server this script
runs on 127.0.0.1, so nothing leaves the machine. Passing means the partner got
the order's webhook once, with the intent's id as its idempotency key, and the
intent is completed.

``--wheel`` installs a wheel built already (``tests/run.py`` passes the one its
packaging stage built); without it the wheel is built with ``python -m build``
by ``--build-python`` (``.venv-build``'s if it exists).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".tmp" / "quickstart"
MARKER = "<!-- quickstart -->"
BLOCK = re.compile(r"^" + re.escape(MARKER) + r"\n```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r"# ([\w./-]+\.py)(: add at the end)?\n")
README_EXTRAS = "aiohttp"


def say(message: str) -> None:
    print(f"[quickstart] {message}", flush=True)


def readme_blocks(readme: Path) -> list[tuple[str, str]]:
    """The ``(language, code)`` of every block marked for the quickstart, in README order."""
    blocks = BLOCK.findall(readme.read_text())
    if not blocks:
        raise SystemExit(f"no block follows {MARKER!r} in {readme}: nothing to test")
    return blocks


class Partner(http.server.BaseHTTPRequestHandler):
    """The webhook receiver the README's handler posts to: records and answers 204."""

    received: list[dict[str, object]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.received.append(
            {
                "path": self.path,
                "key": self.headers.get("Idempotency-Key"),
                "body": json.loads(body or b"null"),
            }
        )
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        say("partner: " + format % args)


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    """Run ``cmd``, echo it, and fail with its output if it fails; return its stdout."""
    say("$ " + shlex.join(cmd))
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        sys.stdout.write(done.stdout + done.stderr)
        raise SystemExit(f"exit {done.returncode}: {shlex.join(cmd)}")
    return done.stdout


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


def quickstart(python: str, wheel: Path) -> None:
    """Follow the README in a new project; raise SystemExit on the first thing that fails."""
    shutil.rmtree(WORK, ignore_errors=True)
    project = WORK / "project"
    project.mkdir(parents=True)
    blocks = readme_blocks(ROOT / "README.md")
    venv, env = fresh_venv(python, wheel)

    Partner.received.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Partner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    partner_url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    try:
        for language, code in blocks:
            if language == "sh":
                for line in code.splitlines():
                    cmd = command(line, venv)
                    if cmd:
                        run(cmd, project, env)
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
                    if "PARTNER_WEBHOOK_URL" in code:
                        settings.write(
                            f"PARTNER_WEBHOOK_URL = {partner_url!r}  # tests/quickstart.py\n"
                        )
            else:
                say(f"write {title.group(1)}")
                path.write_text(code)
        check(venv, project, env)
    finally:
        server.shutdown()


def check(venv: Path, project: Path, env: dict[str, str]) -> None:
    """The partner got the webhook once, keyed by the intent's id, and the intent completed."""
    probe = (
        "import django_intents, json; from django_intents.models import Intent; "
        "print(json.dumps({'file': django_intents.__file__, "
        "'intents': list(Intent.objects.values('id', 'state'))}))"
    )
    cmd = [str(venv / "bin" / "python"), "manage.py", "shell", "-c", probe]
    seen = json.loads(run(cmd, project, env).strip().splitlines()[-1])
    problems = []
    if not seen["file"].startswith(str(venv)):
        problems.append(f"django_intents came from {seen['file']}, not the installed wheel")
    if [row["state"] for row in seen["intents"]] != ["completed"]:
        problems.append(f"expected one completed intent, found {seen['intents']}")
    expected = [
        {"path": "/hooks", "key": row["id"], "body": {"order": 1, "total": "42"}}
        for row in seen["intents"]
    ]
    if Partner.received != expected:
        problems.append(f"the partner received {Partner.received}, expected {expected}")
    if problems:
        raise SystemExit("; ".join(problems))


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
