"""How a command shows long work: a progress bar on a terminal, plain lines elsewhere.

On a terminal, ``tqdm`` draws the count, the rate and the time left (when
the total is known) on one line it redraws. Written to a file, a pipe or a
log collector, a redrawn line is noise, so the same progress goes out as a
plain line every ``every`` seconds instead, and none at all for work done
sooner. ``tqdm`` rather than ``rich``: one small package with no
dependencies of its own, and a progress bar is all a command needs of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm  # type: ignore[import-untyped]

PLAIN_EVERY = 10.0  # seconds between two plain progress lines


def raw(stream: Any) -> TextIO:
    """The stream under a command's ``self.stdout``, whose ``write`` ends every
    call with a newline: a redrawn line must not have one."""
    out: TextIO = getattr(stream, "_out", stream)
    return out


class Progress:
    """Progress of ``total`` units of work (``None``: unknown), advanced from one thread."""

    def __init__(
        self,
        *,
        description: str,
        unit: str,
        stream: TextIO,
        total: int | None = None,
        tty: bool | None = None,
        every: float = PLAIN_EVERY,
        write: Callable[[str], None] | None = None,
    ) -> None:
        if tty is None:
            isatty = getattr(stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self._description, self._unit, self._total = description, unit, total
        self._done = 0
        # Several pools (one per database) advance one bar from their recorders' threads.
        self._lock = threading.Lock()
        self._every = every
        self._started = self._last = time.monotonic()
        self._write = write or (lambda line: print(line, file=stream, flush=True))
        self._bar = (
            tqdm(total=total, desc=description, unit=f" {unit}", file=stream, leave=True)
            if tty
            else None
        )

    def advance(self, count: int = 1) -> None:
        with self._lock:
            self._done += count
            if self._bar is not None:
                self._bar.update(count)
                return
            now = time.monotonic()
            if now - self._last >= self._every:
                self._last = now
                self._write(self.line(now))

    def line(self, now: float | None = None) -> str:
        """``"draining: 120/500 intents, 40.0/s, about 10 s left"``: the plain form."""
        elapsed = max((time.monotonic() if now is None else now) - self._started, 1e-9)
        rate = self._done / elapsed
        done = f"{self._done}/{self._total}" if self._total is not None else str(self._done)
        text = f"{self._description}: {done} {self._unit}, {rate:.1f}/s"
        if self._total is not None and rate > 0 and self._done < self._total:
            text += f", about {(self._total - self._done) / rate:.0f} s left"
        return text

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
