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
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from django_intents.store.base import COMPLETED, PENDING, RUNNING, Backend
from django_intents.store.claims import (
    BRANCHES,
    FLOOR,
    PRIORITIZED_ORDER,
    ClaimFilters,
    branch_parts,
)

LOCK = " FOR UPDATE SKIP LOCKED"
# How long a limited claim waits for another claim of its kinds (seconds): a
# claim holds the lock for milliseconds, so this only passes when one hangs.
LIMIT_LOCK_WAIT = 10
# The two halves of states.due, each an index range scan.
PENDING_DUE = f"state = '{PENDING}' AND next_at <= %s"
# The same for priorities other than 0, on the virtual column of migration 0007.
PRIORITIZED_DUE = f"prioritized_state = '{PENDING}' AND next_at <= %s"
EXPIRED = f"state = '{RUNNING}' AND claim_until <= %s"
# The state-led indexes (migrations 0002 and 0007) that serve each branch here:
# with most rows of priority 0, MariaDB would rather scan the table and sort.
INDEXES = {
    "intents_claimable_idx": "intents_claim_mysql_idx",
    "intents_high_priority_idx": "intents_prioritized_mysql_idx",
    "intents_low_priority_idx": "intents_prioritized_mysql_idx",
}
# Where the claim floor goes on the expired branch: it applies to priority 0 only.
EXPIRED_FLOOR = "{expired_floor}"


class MySQLBackend(Backend):
    vendor = "mysql"
    # In UTC whatever the session's time_zone; SYSDATE, unlike NOW, is not
    # fixed at the statement's start.
    sql_clock = "SELECT UTC_TIMESTAMP(6)"
    returning = False
    lock_running = " FOR UPDATE"
    # With a list of ids and a test of the state, MariaDB may walk a state-led
    # index instead, locking every row of the state: claimers then deadlock.
    by_id = " FORCE INDEX (PRIMARY)"
    # rows.take computes the same, from the id's UTF-8 bytes whatever the table's charset.
    sql_salted = "MD5(CONCAT(%s, CONVERT(id USING utf8mb4)))"
    # As for sql_insert: the kind was validated, so IGNORE only skips the known key.
    sql_pause = "INSERT IGNORE INTO {paused} (kind, paused_at) VALUES (%s, %s)"

    def __init__(self, alias: str, model: Any) -> None:
        super().__init__(alias, model)
        # IGNORE is safe here: every value was validated before, so the only
        # error it can swallow is the duplicate key that makes enqueue idempotent.
        self.sql_insert = (
            f"INSERT IGNORE INTO {self.table} ({self.column_list}) VALUES {{rows}} RETURNING kind"
        )

        # Pending intents by priority branch (claims.Branch), each a range of one
        # index, then the expired leases of every priority, in one statement:
        # the claim sorts what they found and keeps its limit.
        def parts(select: str, order: bool, tail: str) -> str:
            pending = [
                part.replace(branch.index, INDEXES[branch.index]).replace(
                    "{due}", PENDING_DUE if branch.floored else PRIORITIZED_DUE
                )
                for part, branch in zip(
                    branch_parts(
                        f"(SELECT {select} FROM {self.table} FORCE INDEX ({{index}}) "
                        f"WHERE {{due}} AND {{branch}}{{filters}}"
                        f"{' {order}' if order else ''}{tail})"
                    ),
                    BRANCHES,
                    strict=True,
                )
            ]
            expired = (
                f"(SELECT {select} FROM {self.table} WHERE {EXPIRED}{{filters}}{EXPIRED_FLOOR}"
                f"{' ' + PRIORITIZED_ORDER if order else ''}{tail})"
            )
            return " UNION ALL ".join([*pending, expired])

        self.sql_claim = parts(self.column_list, True, f" LIMIT %s{LOCK}")
        self.sql_probe = parts("1", False, " LIMIT 1")
        self.sql_kind_of = f"SELECT kind FROM {self.table} WHERE id = %s"
        self.sql_lock_running = (
            f"SELECT id, kind, claim_token FROM {self.table}{self.by_id} "
            f"WHERE id IN ({{ids}}) AND state = '{RUNNING}' FOR UPDATE"
        )
        self.sql_complete_ids = (
            f"UPDATE {self.table}{self.by_id} SET state = '{COMPLETED}', claim_token = '', "
            f"claim_until = NULL, "
            f"updated_at = %s WHERE id IN ({{ids}}) AND state = '{RUNNING}'"
        )
        self.sql_exhausted_select = (
            f"SELECT id, kind FROM {self.table} WHERE state = '{RUNNING}' AND claim_until <= %s "
            f"AND attempts >= snoozes + %s{{filters}}{LOCK}"
        )

    def branched(
        self, statement: str, *, now: datetime, filters: ClaimFilters, tail: list[Any]
    ) -> tuple[str, list[Any]]:
        """As the base's, with the expired branch last, its floor for priority 0 only."""
        where, params = self.filters(filters)
        floor, floor_params = self.floor(filters)
        expired_floor = "" if filters.since is None else " AND (priority <> 0 OR next_at >= %s)"
        at = self.dt(now)
        values: list[Any] = []
        for branch in BRANCHES:
            values += [at, *params, *(floor_params if branch.floored else ()), *tail]
        values += [at, *params, *floor_params, *tail]
        text = statement.replace("{filters}", where).replace(FLOOR, floor)
        return text.replace(EXPIRED_FLOOR, expired_floor), values

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
                    cursor.execute("SELECT GET_LOCK(%s, %s)", [name, LIMIT_LOCK_WAIT])
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
                    cursor.execute("SELECT RELEASE_LOCK(%s)", [name])

    def lock_name(self, kind: str) -> str:
        """A kind's lock name, one per database and table: names are server-wide (64 chars)."""
        key = f"{self.connection.settings_dict['NAME']}\x00{self.table}\x00{kind}"
        return "django_intents." + hashlib.sha256(key.encode()).hexdigest()[:40]

    def cancel_exhausted(
        self, *, now: datetime, max_attempts: int, kinds: list[str] | None, error: str
    ) -> list[str]:
        where, params = self.kind_filter(kinds)
        at = self.dt(now)
        with transaction.atomic(using=self.alias), self.cursor() as cursor:
            cursor.execute(
                self.sql_exhausted_select.replace("{filters}", where), [at, max_attempts, *params]
            )
            found = cursor.fetchall()
            if found:
                ids = f" AND id IN ({', '.join(['%s'] * len(found))})"
                statement = self.sql_exhausted.replace("{filters}", ids)
                cursor.execute(statement, [error, at, at, max_attempts, *(row[0] for row in found)])
        return [row[1] for row in found]

    def complete_many(
        self, pairs: list[tuple[str, str]], *, now: datetime
    ) -> list[tuple[str, str]]:
        """Lock the running rows among the ids, keep those whose token matches, complete them."""
        ids = list(dict.fromkeys(id for id, _ in pairs))
        wanted = set(pairs)
        with transaction.atomic(using=self.alias), self.cursor() as cursor:
            cursor.execute(
                self.sql_lock_running.replace("{ids}", ", ".join(["%s"] * len(ids))), ids
            )
            held = [(id, kind) for id, kind, token in cursor.fetchall() if (id, token) in wanted]
            if held:
                statement = self.sql_complete_ids.replace("{ids}", ", ".join(["%s"] * len(held)))
                cursor.execute(statement, [self.dt(now), *(id for id, _ in held)])
        return held

    def transition(self, statement: str, params: list[Any], id: str) -> list[str]:  # noqa: A002
        with self.cursor() as cursor:
            cursor.execute(statement, params)
            if not cursor.rowcount:
                return []
            cursor.execute(self.sql_kind_of, [id])
            return [row[0] for row in cursor.fetchall()]
