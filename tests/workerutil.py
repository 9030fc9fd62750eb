"""Run ``manage.py run_intent_workers`` as a real subprocess against the test database.

Each worker gets its own process group, so a test can SIGKILL it with every
thread it started, and its stderr goes to a file (a pipe nobody reads could
fill up and block the worker). Every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 15.0) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class Worker:
    """One ``run_intent_workers`` process."""

    def __init__(
        self, args: list[str], intents: dict[str, Any], env: dict[str, str], cwd: Path = ROOT
    ) -> None:
        self.args = args
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in kill()
            mode="w+b", prefix="intents-worker-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_intent_workers", *args],
            cwd=cwd,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
                "INTENTS_TEST_INTENTS": json.dumps(intents),
                "PYTHONUNBUFFERED": "1",
                **env,
            },
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; fail (showing its log) if it does not in time."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.args} still running after {timeout:g} s; log:\n{self.log}"
            ) from None

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill_group(self) -> None:
        """SIGKILL the worker's whole process group: a crash, nothing runs after it."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def started(self) -> bool:
        return "starting " in self.log

    def assert_clean_exit(self, timeout: float) -> None:
        code = self.wait(timeout)
        assert code == 0, f"worker exited {code}; log:\n{self.log}"
