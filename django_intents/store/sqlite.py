"""SQLite: one writer at a time, so a claim selects and updates inside ``BEGIN IMMEDIATE``.

A deferred transaction that reads and then writes can fail at once with
"database is locked" when another connection wrote meanwhile; an immediate
one takes the write lock first and waits for the busy timeout instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.store.base import Backend
from django_intents.store.endings import Ending, Finished
from django_intents.store.statements import spread
from django_intents.store.wakeups import POLL, WATCH, Wakeup


class SQLiteBackend(Backend):
    """SQLite's statements are ``sql/sqlite.sql``.

    No ``clock`` statement: SQLite has no server, and its clock is the C
    library's wall clock in this process, which clock.py reads itself (to the
    microsecond, where SQLite's 'now' gives milliseconds).
    """

    vendor = "sqlite"

    def wakeup(self) -> Wakeup:
        """A file's commits can be watched (``CommitWatch``); an in-memory
        database has no other connection to commit."""
        if self.connection.is_in_memory_db():  # type: ignore[attr-defined]
            return Wakeup(POLL)
        return Wakeup(WATCH)

    def watch_commits(self, connection: BaseDatabaseWrapper) -> CommitWatch:
        return CommitWatch(connection, self.sql.data_version)

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """Apply a batch of fenced retries, cancellations and releases; return what moved."""
        params: list[Any] = []
        for e in endings:
            next_at = self.dt(e.next_at) if e.next_at else None
            params += [e.id, e.token, e.state, next_at, e.error, int(e.snooze), int(e.unstarted)]
            params.append(e.traceback)
        with self.cursor() as cursor:
            statement = spread(self.sql.finish_many, rows=len(endings))
            cursor.execute(statement, [*params, self.dt(now)])
            return [(id, kind, state) for id, kind, state in cursor.fetchall()]

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        ids = list(dict.fromkeys(id for id, _ in pairs))
        rows = self.table.run("complete_many", now=self.dt(now), ids=ids, pairs=list(pairs))
        return [(row[0], row[1]) for row in rows]

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE``; inside a caller's transaction, that one is used."""
        connection = self.connection
        if connection.in_atomic_block:
            yield
            return
        connection.ensure_connection()
        with self.cursor() as cursor:
            cursor.execute(self.sql.begin_immediate)
            try:
                yield
            except BaseException:
                cursor.execute(self.sql.rollback)
                raise
            cursor.execute(self.sql.commit)


class CommitWatch:
    """SQLite counts commits: ``PRAGMA data_version`` changes when another
    connection has committed, and reading it takes no lock."""

    def __init__(self, connection: BaseDatabaseWrapper, statement: str) -> None:
        self._raw: Any = connection.connection
        self._statement = statement
        self._seen = self._version()

    def changed(self) -> bool:
        version = self._version()
        if version == self._seen:
            return False
        self._seen = version
        return True

    def _version(self) -> Any:
        return self._raw.execute(self._statement).fetchone()[0]
