"""What PostgreSQL's claims learn from each other: which statement the next claim runs.

The backend is built once per database alias and model, so what it learns
serves every claim of the process: whether intents of other priorities may
be due (``claim_by_priority``), which limited kinds claim exactly for a
while (``LimitedClaims.claim``), and where an exact claim's walk starts
(``heldhead.py``). The pool's listener thread gives hints (``hint``).
"""

from __future__ import annotations

from typing import Any

from django_intents.store.postgresql.heldhead import Level


class Learned:
    """The claims' memory: plain dictionaries, read and written by one claim at a time."""

    def __init__(self) -> None:
        # Per claimed kinds: whether intents of other priorities may be due.
        self.others_due: dict[tuple[str, ...] | None, bool] = {}
        # How many hints the listener has given; a claim that began before one
        # must not clear it (``settle_others``).
        self.heard = 0
        # Per limited kinds: until when they claim exactly (``LimitedClaims.claim``).
        self.tight: dict[tuple[str, ...], float] = {}
        # Per claim (``heldhead.key_of``): the held-back head an exact claim starts past.
        self.held_heads: dict[tuple[Any, ...], list[Level]] = {}

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
