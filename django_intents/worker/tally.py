"""What a pool's attempts came to, per kind: the counts its summaries and a drain's table show.

The recorder counts each result here on the loop thread as it learns how it
was recorded (the database took it, or it had nothing to record), so the
counts are what this pool did, never a scan of the table. An attempt's
*column* is how its intent left it: ``completed``; ``retried`` (a failure
due again later); ``snoozed`` (``Retry(after=...)``); ``cancelled`` (``Stop``
or ``MAX_ATTEMPTS``); ``released`` (given back unfinished: released at
shutdown, or its claim lost to another pool); ``timed out`` (the attempt
outlived its timeout, whatever became of the intent).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from django_intents.signals import Outcome

COMPLETED, RETRIED, SNOOZED, CANCELLED, RELEASED, TIMED_OUT = COLUMNS = (
    "completed",
    "retried",
    "snoozed",
    "cancelled",
    "released",
    "timed out",
)


def column(outcome: Outcome, *, cancelled: bool = False) -> str:
    """The column an attempt with ``outcome`` counts in; ``cancelled``: its intent was."""
    if outcome is Outcome.TIMEOUT:
        return TIMED_OUT
    if outcome is Outcome.SUCCESS:
        return COMPLETED
    if outcome is Outcome.SNOOZED:
        return SNOOZED
    if outcome is Outcome.FENCED:
        return RELEASED
    return CANCELLED if cancelled or outcome is Outcome.STOPPED else RETRIED


class Tally:
    """Attempts per kind and column since ``start``; read and written by the loop thread only.

    ``watch`` hands every count to one more callable (a progress display).
    """

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._started = time.monotonic()
        self._watcher: Callable[[int], None] | None = None

    def start(self) -> None:
        self._started = time.monotonic()

    def watch(self, watcher: Callable[[int], None]) -> None:
        self._watcher = watcher

    def add(self, kind: str, column: str) -> None:
        self._counts[kind, column] += 1
        if self._watcher is not None:
            self._watcher(1)

    def totals(self) -> Counter[str]:
        """Attempts per column, every kind together."""
        totals: Counter[str] = Counter()
        for (_, name), n in self._counts.items():
            totals[name] += n
        return totals

    def elapsed(self) -> float:
        return max(time.monotonic() - self._started, 1e-9)

    def line(self) -> str:
        """``"5 completed, 1 retried, 0 snoozed, ... in 3.2 s (1.9/s)"``."""
        totals, elapsed = self.totals(), self.elapsed()
        counts = ", ".join(f"{totals[name]} {name}" for name in COLUMNS)
        return f"{counts} in {elapsed:.1f} s ({sum(totals.values()) / elapsed:.1f}/s)"

    def table(self) -> str:
        """The outcomes per kind as a plain-text table, then the total and the rate."""
        kinds = sorted({kind for kind, _ in self._counts})
        rows = [[kind, *(str(self._counts[kind, name]) for name in COLUMNS)] for kind in kinds]
        totals = self.totals()
        rows.append(["total", *(str(totals[name]) for name in COLUMNS)])
        header = ["kind", *COLUMNS]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

        def render(row: list[str]) -> str:
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
            return "  ".join(cells).rstrip()

        done, elapsed = sum(totals.values()), self.elapsed()
        rate = f"{done} attempt(s) in {elapsed:.1f} s: {done / elapsed:.1f} intents/s"
        return "\n".join([render(header), *map(render, rows), rate])
