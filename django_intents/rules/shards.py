"""Which of several databases a target's intents live on (issue 41).

A target's limits, breaker, pace and order are counted in the rows of one
database, so every intent of a target must go to the same one, on every
host and in every release: the shard is read from a digest of the target,
never from Python's ``hash()`` (salted per process) nor from anything that
changes when a database is added elsewhere in the list's order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def shard_of(target: str, aliases: Sequence[str]) -> str:
    """The alias among ``aliases`` that holds the intents of ``target``.

    Adding an alias moves about ``1/len(aliases)`` of the targets, as any
    modulo does: move the queue's pending intents before growing the list
    (docs/scaling.md).
    """
    if not aliases:
        raise ValueError("shard_of() needs at least one database alias")
    number = int.from_bytes(hashlib.sha256(target.encode()).digest()[:8], "big")
    return aliases[number % len(aliases)]
