"""What a pool's claims remember between turns (``ClaimMemory``): the pool owns it.

A pool makes one and passes it to every claim it makes
(``Intent.objects.claim_many(..., memory=...)``); its listener thread gives
hints into it (``hint``). A backend may read and update it to choose the
statement a claim runs (PostgreSQL: whether intents of other priorities may
be due, which limited kinds claim exactly for a while, where an exact
claim's walk starts); SQLite and MySQL ignore it. A claim without one
behaves as a claim that has learned nothing: the full, exact claim. The
store keeps none of it: what one pool's claims learned never steers
another's, nor a caller's claim.
"""

from __future__ import annotations

import time
from typing import Any

from django_intents.rules.targets import Rate

# Seconds between a pool's looks at the targets of its breakers (``store/targets.watch``).
WATCH_EVERY = 0.5


class ClaimMemory:
    """Plain dictionaries, read and written by one claim at a time; ``hint`` may
    come from another thread."""

    def __init__(self) -> None:
        # Per claimed kinds: whether intents of other priorities may be due.
        self.others_due: dict[tuple[str, ...] | None, bool] = {}
        # How many hints the listener has given; a claim that began before one
        # must not clear it (``settle_others``).
        self.heard = 0
        # Per limited kinds: until when (``time.monotonic()``) they claim exactly.
        self.tight: dict[tuple[str, ...], float] = {}
        # Per claim: where an exact claim's walk starts, as the backend keeps it
        # (PostgreSQL: ``heldhead.Level`` stacks, keyed by ``heldhead.key_of``).
        self.held_heads: dict[tuple[Any, ...], list[Any]] = {}
        # The half-open targets awaiting a probe, by key: (kind, target); and
        # when (``time.monotonic()``) the claims look at the targets again.
        self.probing: dict[str, tuple[str, str]] = {}
        self.watch_at = 0.0
        # The paces holds taught targets (``store/targets.paces``), and when
        # (``time.monotonic()``) the claims read them again.
        self.paces: dict[tuple[str, str], Rate] = {}
        self.paces_at = 0.0

    def paces_due(self) -> bool:
        """Whether a claim reads the targets' paces first (twice a second, ``WATCH_EVERY``)."""
        return self._turn("paces_at")

    def held(self) -> None:
        """A result just held a target: the next claim reads the paces again."""
        self.paces_at = 0.0

    def watch_due(self) -> bool:
        """Whether a claim looks at the targets of its breakers first (twice a second)."""
        return self._turn("watch_at")

    def _turn(self, at: str) -> bool:
        """Whether the look whose next time is the attribute ``at`` is due; if so, the next."""
        now = time.monotonic()
        if now < getattr(self, at):
            return False
        setattr(self, at, now + WATCH_EVERY)
        return True

    def settle_others(self, key: tuple[str, ...] | None, heard: int, due: bool) -> None:
        """Record whether a claim saw intents of other priorities due, unless the
        listener gave a hint while it ran (``heard`` is its count at the start).

        The listener runs in a thread of its own. A claim whose statement began
        before an urgent intent committed did not see it; if its NOTIFY arrived
        meanwhile, clearing the flag would leave that intent to the pool's full
        claim, up to a second later.
        """
        if due or heard == self.heard:
            self.others_due[key] = due

    def hint(self, kind: str) -> None:
        """Intents of ``kind`` at another priority than 0 became due now: the next
        claims of it walk every branch."""
        self.heard += 1  # first: a claim that reads the count after this sees the flag
        for key in list(self.others_due):
            if key is None or kind in key:
                self.others_due[key] = True
