"""PostgreSQL's ``LISTEN``/``NOTIFY``: the session a pool's listener holds.

Enqueue, ``retry_now`` and ``release`` run ``pg_notify`` in their own
statement, so a notification is delivered when that transaction commits and
never for a rolled-back enqueue; a kind whose intents of another priority
than 0 became due is named on ``PRIORITY_CHANNEL`` too. ``LISTEN`` is per
session: the listener holds a connection of its own, and receiving needs
psycopg 3.2 or later (``Connection.notifies`` with a timeout).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.store.base import PRIORITY_CHANNEL
from django_intents.store.statements import bind
from django_intents.store.wakeups import Notification


def supported() -> bool:
    """Whether the driver can deliver notifications: psycopg >= 3.2."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return False
    import psycopg

    return "timeout" in inspect.signature(psycopg.Connection.notifies).parameters


class Session:
    """``LISTEN`` on both channels of an open connection that no one else uses."""

    def __init__(self, connection: BaseDatabaseWrapper, sql: Mapping[str, str]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql["listen"])
            cursor.execute(sql["listen_priority"])
        self._raw: Any = connection.connection

    def receive(self, timeout: float) -> Iterator[Notification]:
        for notification in self._raw.notifies(timeout=timeout):
            yield Notification(notification.payload, notification.channel == PRIORITY_CHANNEL)


def notify(connection: BaseDatabaseWrapper, sql: Mapping[str, str], payload: str) -> None:
    """Send ``payload`` on the channel enqueue notifies, through ``connection``."""
    with connection.cursor() as cursor:
        cursor.execute(*bind(sql["notify"], {"payload": payload}))
