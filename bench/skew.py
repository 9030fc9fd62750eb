"""Worker processes whose clocks disagree with the database's (SPEC §12).

On PostgreSQL and MariaDB a worker runs with ``skew_clock.c`` preloaded, which
moves the process's wall clock (every reading through the C library:
Python's, the driver's) while the server keeps the true time; it is compiled
on first use with the machine's C compiler. SQLite has no server: its clock is
the one the library reads inside the worker's own process, which the preload
would move as well, so there the worker's Python clocks are moved instead
(``time.time`` and ``django.utils.timezone.now``) and SQLite's own is left
alone. Used by the chaos soak and by ``tests/test_clock_process.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path

SKEW_VARIABLE = "INTENTS_PYTHON_CLOCK_SKEW"  # SQLite's workers: settings read it
SOURCE = Path(__file__).with_name("skew_clock.c")
LIBRARY = Path(__file__).resolve().parent.parent / ".tmp" / "skew" / "skew_clock.so"


def skewed_env(vendor: str, seconds: int) -> dict[str, str] | None:
    """What to add to a worker's environment; ``None`` without a C compiler."""
    if vendor == "sqlite":
        return {SKEW_VARIABLE: str(seconds)}
    library = preload()
    if library is None:
        return None
    return {"LD_PRELOAD": str(library), "INTENTS_CLOCK_SKEW": str(seconds)}  # skew_clock.c


def preload() -> Path | None:
    """``skew_clock.so``, built from its source when missing or older."""
    if LIBRARY.exists() and LIBRARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return LIBRARY
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    building = LIBRARY.with_suffix(f".{time.monotonic_ns()}.so")
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(building), str(SOURCE), "-ldl"]
    subprocess.run(command, check=True, capture_output=True)
    building.replace(LIBRARY)  # atomic: parallel builds never load a half-written file
    return LIBRARY


def skew_python_clocks(seconds: float) -> None:
    """Move this process's wall clock as Python sees it; call it from settings."""
    from django.utils import timezone

    real_time, real_time_ns, real_now = time.time, time.time_ns, timezone.now
    offset = timedelta(seconds=seconds)
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]
    timezone.now = lambda: real_now() + offset  # type: ignore[assignment]
