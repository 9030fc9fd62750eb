"""How a pool can be woken on its database, as the backend says (``Backend.wakeup``).

The pool's threads (``worker/wakeup.py``) ask the store, never the
connection's vendor: a database that notifies (``LISTEN``: a session that
hears each enqueue), one whose commits can be watched (``WATCH``: a counter
read every few milliseconds), or neither (``POLL``). The session and the
watch are the backend's; these are their shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

LISTEN, WATCH, POLL = "listen", "watch", "poll"


@dataclass(frozen=True)
class Wakeup:
    """``how`` a pool can be woken (``LISTEN``, ``WATCH`` or ``POLL``); ``why`` says
    why a database that could tell the pool leaves it to polling."""

    how: str
    why: str = ""


class Notification(NamedTuple):
    """What a listening session heard: a kind (or a payload of the pool's own), and
    whether it came on the channel of intents of another priority than 0."""

    payload: str
    prioritized: bool


class Listening(Protocol):
    """A session that listens on a connection of its own (``Backend.listen``)."""

    def receive(self, timeout: float) -> Iterator[Notification]:
        """What arrives within ``timeout`` seconds, as it arrives."""
        ...


class CommitWatch(Protocol):
    """Another connection's commits, seen on a connection of its own (``Backend.watch_commits``)."""

    def changed(self) -> bool:
        """Whether another connection committed since the last look."""
        ...
