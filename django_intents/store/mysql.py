"""MariaDB and MySQL: no partial indexes and no ``UPDATE ... RETURNING``.

The claim index leads with ``state`` (migration 0002), so "due" is asked as
two ordered range scans, pending and expired, merged in Python. Rows are
locked with ``FOR UPDATE SKIP LOCKED`` by the select and updated by primary
key while the locks are held. A transition reads its row's kind back after
the update, since the update cannot return it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from django_intents.store.base import Backend
from django_intents.store.endings import Ending, Finished

# How long a limited claim waits for another claim of its kinds (seconds): a
# claim holds the lock for milliseconds, so this only passes when one hangs.
LIMIT_LOCK_WAIT = 10


class MySQLBackend(Backend):
    """MariaDB's and MySQL's statements are ``sql/mysql.sql``."""

    vendor = "mysql"
    returning = False

    def head_params(self, kind: str, target: str) -> tuple[str, ...]:
        """A lookup per active state (the ordered index leads with it), each by the
        target's MD5 and the target."""
        return (kind, target, target) * 2

    @contextlib.contextmanager
    def limit_lock(self, kinds: list[str]) -> Iterator[bool]:
        """Named locks (``GET_LOCK``), one per kind, taken in one order by every claimer.

        They belong to the session, not the transaction, so they are released
        after the commit. A claim made inside a caller's own transaction
        releases them before that transaction commits; the limits then hold
        for claims made by pools, which is what runs intents.
        """
        names = sorted(self.lock_name(kind) for kind in kinds)
        taken: list[str] = []
        try:
            with self.cursor() as cursor:
                for name in names:
                    self.table.execute(cursor, "get_lock", name=name, wait=LIMIT_LOCK_WAIT)
                    if cursor.fetchone()[0] != 1:
                        break
                    taken.append(name)
            if len(taken) < len(names):
                yield False
                return
            with self.write_transaction():
                yield True
        finally:
            with contextlib.suppress(DatabaseError), self.cursor() as cursor:
                for name in taken:
                    self.table.execute(cursor, "release_lock", name=name)

    def lock_name(self, kind: str) -> str:
        """A kind's lock name, one per database and table: names are server-wide (64 chars)."""
        key = f"{self.connection.settings_dict['NAME']}\x00{self.table.name}\x00{kind}"
        return "django_intents." + hashlib.sha256(key.encode()).hexdigest()[:40]

    def cancel_exhausted(
        self, *, now: datetime, max_attempts: int, kinds: list[str] | None, error: str
    ) -> list[str]:
        """Lock the exhausted leases, then cancel them by key."""
        params = self.exhausted_params(now, max_attempts, kinds, error)
        with transaction.atomic(using=self.alias), self.cursor() as cursor:
            found = self.table.execute(cursor, "exhausted", **params).fetchall()
            if found:
                ids = [row[0] for row in found]
                self.table.execute(
                    cursor, "exhausted_cancel", error=error, now=params["now"], ids=ids
                )
        return [row[1] for row in found]

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        """Lock the running rows among the ids, keep those whose token matches, complete them."""
        ids = list(dict.fromkeys(id for id, _ in pairs))
        wanted = set(pairs)
        with transaction.atomic(using=self.alias), self.cursor() as cursor:
            running = self.table.execute(cursor, "lock_running", ids=ids).fetchall()
            held = [(id, kind) for id, kind, token in running if (id, token) in wanted]
            if held:
                done = [id for id, _ in held]
                self.table.execute(cursor, "complete_many", now=self.dt(now), ids=done)
        return held

    def finish_many(self, endings: Sequence[Ending], *, now: datetime) -> list[Finished]:
        """Lock the running rows among the endings' ids, keep those whose token still
        matches, and update them by key in one statement, in one write transaction:
        the pair is as fenced as a one-row transition."""
        by_id = {ending.id: ending for ending in endings}
        with self.write_transaction(), self.cursor() as cursor:
            running = self.table.execute(cursor, "lock_running", ids=list(by_id)).fetchall()
            held = [(id, kind) for id, kind, token in running if by_id[id].token == token]
            if not held:
                return []
            moved = [by_id[id] for id, _ in held]
            self.table.execute(
                cursor,
                "finish_many",
                now=self.dt(now),
                ids=[e.id for e in moved],
                states=[(e.id, e.state) for e in moved],
                next_ats=[(e.id, self.dt(e.next_at)) for e in moved if e.next_at],
                errors=[(e.id, e.error) for e in moved if e.error is not None],
                tracebacks=[(e.id, e.traceback) for e in moved if e.traceback is not None],
                snoozed=[e.id for e in moved if e.snooze],
                unstarted=[e.id for e in moved if e.unstarted],
            )
        return [(id, kind, by_id[id].state) for id, kind in held]

    def estimate_rows(self, union: str, params: list[Any], count: int) -> list[int] | None:
        """The ``rows`` times ``filtered`` of each SELECT of ``EXPLAIN``: one row per
        SELECT, numbered from 1 (MariaDB adds a UNION RESULT row, numbered NULL)."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {union}", params)
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        by_select = {row["id"]: row for row in rows if row["id"] is not None}
        return [
            int(int(row["rows"] or 0) * float(row.get("filtered") or 100) / 100)
            for _, row in sorted(by_select.items())
        ]

    def transition(self, name: str, id: str, **params: Any) -> list[str]:  # noqa: A002
        """Run the one-row ``UPDATE`` ``name``, then read the kind of the row it changed."""
        with self.cursor() as cursor:
            if not self.table.execute(cursor, name, id=id, **params).rowcount:
                return []
            return [row[0] for row in self.table.execute(cursor, "kind_of", id=id).fetchall()]
