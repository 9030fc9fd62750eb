"""PostgreSQL: finished intents out of the live partition, into a partition per day.

Migration 0018 makes the intents table a partitioned one: partition 0 holds
the live intents, the claims' and the fenced writes' only table; a finished
intent is moved out (``move_out``) into the partition of the day it finished
(``updated_at``), which is made the first time a move needs it. Retention
then drops a day whole (``drop_days``) where it would have deleted its rows
one by one; the claims never walk a finished row nor its dead versions in
the live partition's indexes for long, whatever the history holds.

The day's keys (``django_intents_key``, which keeps ids unique across the
partitions) are deleted with it, so that the table stays the size of the
rows: the only rows retention still deletes one by one here, each a few
bytes, and the only dead tuples it leaves.

A finished intent whose day has no partition, and cannot get one now (its
lock not had in time), stays in the live partition, where it harms no claim
(the claims' indexes leave finished rows out), until a later move: there is
no default partition, which would make PostgreSQL scan it, under a lock on
the whole table, for every day partition made after.

Making or dropping a partition takes a lock on the whole table for a few
milliseconds; each is sent with a ``lock_timeout`` of a second, so that one
that waits behind a long transaction gives up (and is tried again later)
instead of making every query that comes after it wait too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from django_intents.rules.days import SECONDS_A_DAY, day_of
from django_intents.store.table import Table, day_partition

# Intents moved out per transaction: its locks are on finished rows only.
MOVE_BATCH = 2_000
LOCK_TIMEOUT = "1s"


class Days:
    """The day partitions of one database's intents table."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._label = table.model._meta.app_label
        self._raw = table.model._meta.db_table
        self._made: set[int] = set()  # the days today() made or found made

    def move_out(self, *, limit: int = MOVE_BATCH) -> int:
        """Move up to ``limit`` finished intents out of the live partition; how many moved.

        The batch is locked first and its days' partitions looked up; a day
        without one ends the transaction, its partition is made (in a
        transaction of its own, which must not hold the batch's locks) and
        the batch is taken again. A day whose partition cannot be made now
        keeps its intents in the live partition for a later move. The keys
        go before the rows, in the move's transaction, so that an enqueue of
        the same id meets the move on the key (``insert`` in
        store/sql/postgresql.sql).
        """
        table = self.table
        for attempt in (1, 2):
            with transaction.atomic(using=table.alias), table.cursor() as cursor:
                table.execute(cursor, "finished_batch", limit=limit)
                batch = cursor.fetchall()
                existing = set(self.existing())
                missing = {day for _, day in batch} - existing
                if not missing or attempt == 2:
                    ids = [id for id, day in batch if day in existing]
                    if not ids:
                        return 0
                    table.execute(cursor, "keep_keys", ids=ids)
                    table.execute(cursor, "move_out", ids=ids)
                    return int(cursor.rowcount)
            self.make(missing)  # the batch's locks released: then again
        return 0

    def today(self, now: datetime) -> int:
        """The day of ``now``, its partition made once a day per process if it is
        missing. The completions check that it is there as they move (a day
        that has none keeps its completed intents in place, for a later move)."""
        day = day_of(now)
        if day not in self._made:
            self.make([day])
            self._made.add(day)
        return day

    def forget(self, day: int | None = None) -> None:
        """Forget that ``day`` (or every day) was made: its partition went (a
        migration reversed, say), and the next completion on it makes it again."""
        if day is None:
            self._made.clear()
        else:
            self._made.discard(day)

    def into(self, day: int) -> dict[str, Any]:
        """The parameters of ``complete_many`` that name the partition of ``day``."""
        return {"day": day, "partition": day_partition(self._label, day)}

    def make(self, days: Iterable[int]) -> None:
        """Make the partitions of ``days`` that do not exist; one that cannot be made
        now (its lock not had within ``LOCK_TIMEOUT``) is left for a later call."""
        # The catalog, not a memory: another process may have dropped a day.
        for day in sorted(set(days) - set(self.existing())):
            name = self._quote(day_partition(self._label, day))
            try:
                with transaction.atomic(using=self.table.alias), self.table.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(
                        f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {self.table.name} "
                        f"FOR VALUES FROM ({day}) TO ({day + 1})"
                    )
                    # By id: Intent.objects.get and an enqueue's look for a known id.
                    cursor.execute(f'CREATE INDEX IF NOT EXISTS {name[:-1]}_id" ON {name} (id)')
            except DatabaseError:
                continue  # a lock not had in time, or another pool made it: later, or there

    def existing(self) -> dict[int, str]:
        """Day -> the name of its partition, as the catalog has them now."""
        with self.table.cursor() as cursor:
            self.table.execute(cursor, "days", parent=self._raw)
            return {day: name for name, day in cursor.fetchall()}

    def drop_days(
        self, cutoffs: Mapping[str, datetime | None], *, dry_run: bool = False
    ) -> tuple[dict[str, int], list[int]]:
        """Drop every day partition whose rows are all past their state's cutoff (None:
        that state is kept); the rows they held, by state, and the days dropped."""
        latest = max((cutoff for cutoff in cutoffs.values() if cutoff is not None), default=None)
        counts: dict[str, int] = {}
        dropped: list[int] = []
        if latest is None:
            return counts, dropped
        for day, name in sorted(self.existing().items()):
            end = (day + 1) * SECONDS_A_DAY
            if end > latest.timestamp():
                continue
            quoted = self._quote(name)
            try:
                with transaction.atomic(using=self.table.alias), self.table.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    cursor.execute(f"SELECT state, count(*) FROM {quoted} GROUP BY state")
                    held = dict(cursor.fetchall())
                    if not all(_past(cutoffs.get(state), end) for state in held):
                        continue  # a state kept, or younger, among its rows
                    if not dry_run:  # the day's keys first: the table stays the size of the rows
                        cursor.execute(
                            f"DELETE FROM {self.table.keys} AS k USING {quoted} AS d "
                            "WHERE k.id = d.id"
                        )
                        cursor.execute(f"DROP TABLE {quoted}")
            except DatabaseError:
                continue  # its rows stay, for the next prune or the row by row deletes
            dropped.append(day)
            for state, count in held.items():
                counts[state] = counts.get(state, 0) + int(count)
        return counts, dropped

    def _quote(self, name: str) -> str:
        return str(self.table.connection.ops.quote_name(name))


def _past(cutoff: datetime | None, end: int) -> bool:
    """Whether a day ending at ``end`` (epoch seconds) is wholly past ``cutoff``."""
    return cutoff is not None and end <= cutoff.timestamp()
