"""PostgreSQL's claim of kinds with ``LIMITS``: the kinds' advisory locks, then one statement.

The locks serialise the limited claims of a kind across every pool; the
statement, run after them in the same transaction (one round trip, see
``cursors.one_round_trip``), sees every claim committed before they were
granted. While the kinds are far from their caps it is the plain claim behind
a count of the live leases per target; near them, the exact one, which counts
the live leases per target and per kind and claims in order only what still
fits (``limits.py`` says the rule; the portable version is ``limited.py``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from django_intents.rules.batches import MAX_LIMIT
from django_intents.store.claims import Ask, ClaimFilters, Claims, Riders
from django_intents.store.limited import scan_size
from django_intents.store.memory import ClaimMemory
from django_intents.store.postgresql import heldhead
from django_intents.store.postgresql.cursors import one_round_trip
from django_intents.store.statements import bind
from django_intents.store.table import Table, claim_params

TIGHT_FOR = 1.0  # seconds a kind found short of room claims exactly, without trying the plain claim


class LimitedClaims:
    """The limited claim of PostgreSQL's backend; what its claims learned is the
    pool's ``ClaimMemory``, passed to each."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def claim(
        self, ask: Ask, tail: dict[str, Any], memory: ClaimMemory, riders: Riders | None = None
    ) -> Claims[Any]:
        """Lock the kinds, then claim: plainly while they have room, else exactly.

        While the fullest target of the limited kinds has room for the whole
        claim under the smallest ``per_target``, and all their live leases
        under the smallest ``running``, no intent can be held back, so the
        claim is a plain one gated by those counts (``roomy_claim``), half
        the cost of the exact one, and it says that it held nothing back
        (``Claims``). Its priorities are as
        ``PostgreSQLBackend.claim_by_priority``'s. A claim three quarters of
        which fit claims plainly what fits (``Claims.bound`` false: no target
        was near its cap). One that finds less room takes the exact
        statement, and so do the claims of the next ``TIGHT_FOR`` seconds,
        rather than trying the plain one first.
        """
        now, limit, filters = ask.now, ask.limit, ask.filters
        key = ("limited", *sorted(filters.limits))
        heard = memory.heard
        if time.monotonic() >= memory.tight.get(key, 0.0):
            zero = filters.since is not None and not memory.others_due.get(key, True)
            query = self.roomy_query(now=now, limit=limit, filters=filters, zero=zero, tail=tail)
            found, _ = self.locked(query, filters=filters, riders=riders)
            if found[0][-2]:  # room for the whole claim
                rows = [row[:-2] for row in found if row[0] is not None]
                if not zero:
                    priority = self.table.columns.index("priority")
                    memory.settle_others(key, heard, any(row[priority] != 0 for row in rows))
                elif 0 < len(rows) < limit:  # priority 0 ran out: the next claim walks every
                    memory.others_due[key] = True  # priority (``claim_by_priority``)
                return Claims(rows)
            spare = found[0][-1]
            if spare * 4 >= limit * 3:
                # Three quarters of the claim or more fit: a pool whose queue
                # has just grown asked for more than the fullest target leaves
                # under a cap far above its share. A plain claim of what fits
                # costs half the exact one, and the claims after it stay plain.
                fewer = self.claim(replace(ask, limit=spare), tail, memory)
                # The rest was not asked for: held back for the floor, but no
                # target was near its cap.
                return Claims(fewer, held_back=True, bound=fewer.bound)
            memory.tight[key] = time.monotonic() + TIGHT_FOR
        return self.claim_exactly(ask, tail, memory, riders)

    def claim_exactly(
        self, ask: Ask, tail: dict[str, Any], memory: ClaimMemory, riders: Riders | None = None
    ) -> Claims[Any]:
        """The exact limited claim (``limited_claim``), of priority 0 alone while
        no other is due.

        The flag that says so comes from the lock's statement, so it is known
        even when every target is full and the claim takes nothing: a claim
        of a limited kind takes an intent of another priority by the claim
        after the one that saw it due.
        """
        now, limit, filters = ask.now, ask.limit, ask.filters
        key = ("limited", *sorted(filters.limits))
        heard = memory.heard
        zero = not memory.others_due.get(key, True)
        probed = zero and self.probes(filters, memory)
        [query] = self.candidate_queries(
            now=now, limit=limit, filters=filters, zero=zero, tail=tail, memory=memory
        )
        limited = {"now": self.table.dt(now), "limited": sorted(filters.limits)}
        rows, (_, others, _) = self.locked(
            query, filters=filters, lock=("limit_lock", limited), riders=riders
        )
        oldest_due = None
        if probed:
            width = heldhead.INFO_COLUMNS
            info = tuple(rows[0][-width:])
            levels = heldhead.advanced(self.held_head(filters, memory), info)
            memory.held_heads[heldhead.key_of(filters)] = levels
            rows = [row[:-width] for row in rows if row[0] is not None]
            if filters.since is None:
                # Its head is the first due intent of priority 0; a live lease
                # that expires makes its intent due again, in its old place.
                oldest_due = min(at for at in (info[1], info[-1], now) if at is not None)
        priority = self.table.columns.index("priority")
        memory.settle_others(key, heard, others or any(row[priority] != 0 for row in rows))
        if zero and others and len(rows) < limit:
            rest = self.claim_exactly(replace(ask, limit=limit - len(rows)), tail, memory)
            rows += rest
        return Claims(rows, held_back=True, oldest_due=oldest_due)

    def candidate_queries(
        self,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        zero: bool = False,
        tail: Mapping[str, Any] | None = None,
        memory: ClaimMemory | None = None,
    ) -> list[tuple[str, list[Any]]]:
        """The exact limited claim, of every branch or of priority 0 alone, bound;
        ``tail`` gives the token salt and the lease end (an EXPLAIN may go without);
        ``memory`` the held-back head it starts past (none without one)."""
        memory = ClaimMemory() if memory is None else memory
        kinds, per_target, running = caps_of(filters)
        capped = "_capped" if any(cap is not None for cap in running) else ""
        params = {
            **claim_params(self.table, now=now, filters=filters, limit=limit),
            "limited": kinds,
            "per_target": per_target,
            "running": running,
            "fetch": scan_size(limit),
        }
        if zero and self.probes(filters, memory):  # the held-back head's, then priority 0 from it
            name = f"limited_claim_head{capped}"
            head = self.held_head(filters, memory)
            params.update(heldhead.parameters(head, filters.since, self.table.dt))
        elif zero:
            name = f"limited_claim_zero{capped}"
        else:
            name = f"limited_claim{capped}"
        return [bind(self.table.sql[name], {**params, **(tail or {})})]

    def roomy_query(
        self,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        zero: bool,
        tail: Mapping[str, Any] | None = None,
    ) -> tuple[str, list[Any]]:
        """``roomy_claim`` (or ``_zero``) bound as ``candidate_queries``'s."""
        kinds, per_target, running = caps_of(filters)
        params = {
            **claim_params(self.table, now=now, filters=filters, limit=limit),
            "limited": kinds,
            "least_per_target": smallest(per_target),
            "least_running": smallest(running),
        }
        name = "roomy_claim_zero" if zero else "roomy_claim"
        return bind(self.table.sql[name], {**params, **(tail or {})})

    def locked(
        self,
        query: tuple[str, list[Any]],
        *,
        filters: ClaimFilters,
        lock: tuple[str, dict[str, Any]] | None = None,
        riders: Riders | None = None,
    ) -> tuple[list[Any], Any]:
        """``query`` run after the kinds' advisory locks (the statement ``lock`` names,
        by default ``limit_lock_only``), in one transaction and one round trip
        (``one_round_trip``): its rows, and the lock statement's one row.

        The first of a claim's statements completes its ``riders`` before the
        locks, so that the places they held are free for the claim (the live
        leases it counts are read after them, in the same transaction).
        """
        table = self.table
        lock_name, lock_params = lock or ("limit_lock_only", {})
        keys = sorted(lock_key(kind) for kind in filters.limits)
        riding = riders if riders is not None and riders.pairs and not riders.sent else None
        with table.cursor() as done, table.cursor() as locks, table.cursor() as cursor:
            with one_round_trip(table.alias):
                if riding is not None:
                    ids, tokens = (list(column) for column in zip(*riding.pairs, strict=True))
                    table.execute(
                        done, "complete_many", now=riding.at, ids=ids, tokens=tokens, **riding.into
                    )
                table.execute(locks, lock_name, **lock_params, keys=keys)
                cursor.execute(*query)
            if riding is not None:
                riding.done, riding.sent = [(row[0], row[1]) for row in done.fetchall()], True
            return cursor.fetchall(), locks.fetchone()

    def probes(self, filters: ClaimFilters, memory: ClaimMemory) -> bool:
        """Whether an exact claim of priority 0 looks for the held-back head: a full
        claim does, to find it; one above the floor, to keep one it remembers."""
        return filters.since is None or bool(self.held_head(filters, memory))

    def held_head(self, filters: ClaimFilters, memory: ClaimMemory) -> list[heldhead.Level]:
        """The held-back head a claim above the floor starts past; a full claim
        (no floor) walks from the start and makes it anew."""
        if filters.since is None:
            return []
        return memory.held_heads.get(heldhead.key_of(filters), [])


def caps_of(filters: ClaimFilters) -> tuple[list[str], list[int | None], list[int | None]]:
    """The limited kinds in order, with their ``per_target`` and ``running`` caps."""
    kinds = sorted(filters.limits)
    limits = [filters.limits[kind] for kind in kinds]
    return kinds, [c.per_target for c in limits], [c.running for c in limits]


def smallest(caps: list[int | None]) -> int:
    """The smallest of ``caps`` that are set; with none, a cap nothing reaches."""
    return min((cap for cap in caps if cap is not None), default=MAX_LIMIT)


def lock_key(kind: str) -> int:
    """The advisory lock of a kind's limited claims: 64 bits of a hash of its name.

    Advisory locks are per database, and any other user of them on the same
    database would pick its own keys; a collision would only make two kinds'
    limited claims wait for each other.
    """
    digest = hashlib.sha256(b"django_intents.limit\x00" + kind.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
