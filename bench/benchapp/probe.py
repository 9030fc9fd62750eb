"""What every benchmarked job does: nothing, or write down when it started.

The same three functions run under every system, so the only difference
between them is the queue. Times go to files in ``BENCH_STAMPS`` (one per
worker process), never to the database being measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_first_written = False


def _directory() -> Path:
    return Path(os.environ["BENCH_STAMPS"])


def noop() -> None:
    """Do nothing; the first call in each process records when work began."""
    global _first_written
    if not _first_written:
        _first_written = True
        (_directory() / f"first-{os.getpid()}").write_text(repr(time.time()))


def stamp(key: str) -> None:
    """Record ``key`` and the time this handler started."""
    now = time.time()
    with open(_directory() / f"stamps-{os.getpid()}", "a") as out:
        out.write(f"{key} {now!r} {os.getpid()}\n")


def block(key: str) -> None:
    """Record the start, then hang until killed: the worker that runs this dies."""
    stamp(key)
    time.sleep(3600)
