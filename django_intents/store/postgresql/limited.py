"""PostgreSQL's claim of kinds with ``LIMITS``: the kinds' advisory locks, then one statement.

The locks serialise the limited claims of a kind across every pool; the
statement, run after them in the same transaction (one round trip, see
``pgcursors.one_round_trip``), sees every claim committed before they were
granted. While the kinds are far from their caps it is the plain claim behind
a count of the live leases per target; near them, the exact one, which counts
the live leases per target and per kind and claims in order only what still
fits (``limits.py`` says the rule; the portable version is ``limited.py``).
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_intents.store.base import DUE, PENDING, RUNNING
from django_intents.store.claims import (
    BRANCHES,
    FLOOR,
    ClaimFilters,
    Claims,
    Riders,
    branch_parts,
    branch_union,
)
from django_intents.store.limited import EXTRA, MAX_EXTRA_ROWS, MAX_LIMIT
from django_intents.store.postgresql import heldhead

if TYPE_CHECKING:
    from django_intents.store.postgresql.backend import PostgreSQLBackend

ORDER = "ORDER BY priority DESC, next_at, created_at, id"
ZERO = next(branch for branch in BRANCHES if branch.floored)  # the branch of priority 0
TIGHT_FOR = 1.0  # seconds a kind found short of room claims exactly, without trying the plain claim
# For the rest of the claim's transaction, set by its lock statement. The
# live leases are counted on the lease index, partial on "running": every
# claim and every completion leaves an entry there that stays until a vacuum.
# The planner, expecting a few rows, read it as a bitmap, which never marks
# such entries dead, so every claim visited all of them again: in a relay at
# 1,000 deliveries/s, 13,000 entries on 500 pages, 6.3 ms of a 9.3 ms claim.
# A plain index scan marks them as it passes, and the next claims skip them
# (0.15 ms). The claim's other scans are ordered walks, never bitmaps.
NO_BITMAPS = "set_config('enable_bitmapscan', 'off', true)"


class LimitedClaims:
    """The limited claim of ``PostgreSQLBackend``."""

    def build_limited(self: PostgreSQLBackend, returned: str) -> None:
        """The statements, built once: the lock, and the claim with every branch
        (``claims.Branch``) or with priority 0 alone (``claim_limited``).

        The due rows of each branch come in order, leaving out the targets and
        kinds with no room: two small sets computed once (``full_targets``,
        ``full_kinds``; a paused kind has no room, so pauses are tested there,
        not per branch), each probed as a hash per row, not a join, which would
        turn the ordered walk of the claim index into a scan and a sort. A
        relay with a dead partner walks past every due intent of it on each
        claim (900 rows on average), and the hash costs less per row than the
        arrays of text it replaced (1.7 µs against 2.0). The test is spelled
        "(CASE ... THEN NULL ELSE 1 END) IS NOT NULL" so that the planner,
        which cannot see into it, takes it to keep almost every row and walks
        the index in order; written "<> ALL (...)" it was estimated to keep
        one row in a hundred, and the planner sorted every due row. Window
        functions cannot sit beside FOR UPDATE, so they rank the
        union of the branches: in order, what still fits its target's and its
        kind's room. The statement stays under psycopg's 4,096 bytes, beyond
        which the driver converts its placeholders again on every call.
        """
        table = self.table
        due = branch_parts(
            f"{{name}} AS MATERIALIZED (SELECT t.id, t.kind, t.target, t.priority, t.next_at, "
            f"t.created_at, t.state AS was, t.claim_until AS lease_end "
            f"FROM {table} AS t WHERE {DUE} AND {{branch}}{{filters}} "
            f"AND (CASE WHEN (t.kind, t.target) IN (SELECT kind, target FROM full_targets) "
            f"OR t.kind IN (SELECT kind FROM full_kinds) "
            f"THEN NULL ELSE 1 END) IS NOT NULL "
            f"{{order}} LIMIT {{room}} FOR UPDATE OF t SKIP LOCKED)"
        )
        head = (
            f"WITH live AS MATERIALIZED (SELECT kind, target, count(*) AS n, "
            f"min(next_at) AS since FROM {table} "
            f"WHERE state = '{RUNNING}' AND claim_until > %s AND kind = ANY (%s::text[]) "
            f"GROUP BY kind, target), "
            f"caps AS MATERIALIZED (SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) "
            f"AS c(kind, per_target, running)), "
            f"full_targets AS MATERIALIZED (SELECT kind, target FROM live "
            f"JOIN caps USING (kind) WHERE n >= per_target), "
            f"full_kinds AS MATERIALIZED (SELECT kind FROM live JOIN caps USING (kind) "
            f"GROUP BY kind, running HAVING sum(n) >= running "
            f"UNION ALL SELECT kind FROM {self.paused_table}), "
        )
        # Each row's place at its target and in its kind: its rank among the
        # due rows plus the live leases, joined, not looked up per row (a
        # correlated count over ``live`` cost 0.5 ms for a claim of 84 rows).
        # Without a ``running`` cap in the claim the kind's rank is not asked
        # for: one window and one sort fewer.
        ranked = (
            f"ranked AS (SELECT due.*, row_number() OVER (PARTITION BY kind, target {ORDER}) "
            f"+ COALESCE(live.n, 0) AS at_target FROM due LEFT JOIN live USING (kind, target)), "
        )
        fits = "per_target IS NULL OR at_target <= per_target"
        by_kind = (
            f"fitting AS (SELECT ranked.*, row_number() OVER (PARTITION BY kind {ORDER}) "
            f"+ COALESCE(kinds.n, 0) AS at_kind FROM ranked LEFT JOIN (SELECT kind, sum(n) AS n "
            f"FROM live GROUP BY kind) AS kinds USING (kind) WHERE {fits}) "
        )
        by_target = f"fitting AS (SELECT ranked.*, 0 AS at_kind FROM ranked WHERE {fits}) "
        update = (
            f"UPDATE {table} AS t SET state = '{RUNNING}', attempts = t.attempts + 1, "
            f"claim_token = md5(%s || t.id), claim_until = %s, updated_at = %s "
            f"FROM (SELECT id, was, lease_end FROM fitting WHERE running IS NULL "
            f"OR at_kind <= running {ORDER} LIMIT %s) AS chosen WHERE t.id = chosen.id "
            f"RETURNING {returned}, chosen.was, chosen.lease_end"
        )

        def claim(parts: list[str], union: str, skip: str = "") -> dict[bool, str]:
            """The statement by whether a kind of the claim has a ``running`` cap."""
            caps = "SELECT u.*, caps.per_target, caps.running"
            start = (
                f"{head}{skip}{', '.join(parts)}, due AS ({caps} FROM ({union}) AS u "
                f"LEFT JOIN caps USING (kind)), {ranked}"
            )
            return {True: start + by_kind + update, False: start + by_target + update}

        self.sql_limited_claim = claim(due, branch_union(BRANCHES))
        zero = due[BRANCHES.index(ZERO)]
        zero = zero[: zero.index(" LIMIT ")] + " LIMIT %s FOR UPDATE OF t SKIP LOCKED)"
        self.sql_limited_claim_zero = claim([zero], branch_union([ZERO]))
        # From past the held-back head (``heldhead.py``): found by full claims, kept by
        # floored ones while it holds. Its probe costs 3 ms to plan: others go without.
        skip = heldhead.CTES.replace("{table}", table)
        skip = skip.replace("{due}", f"{DUE} AND {ZERO.where}{{filters}}")
        self.sql_limited_claim_head = {
            capped: heldhead.told(statement)
            for capped, statement in claim(
                [zero.replace(FLOOR, heldhead.FROM_HEAD)], branch_union([ZERO]), skip
            ).items()
        }
        # The claim while the limited kinds have room for the whole claim
        # (``claim_limited``): a plain claim, of every branch or of priority 0
        # alone, each branch gated by the kinds' live leases, which the final
        # SELECT also says, so that a claim that took nothing still says
        # whether it had room. The gate compares the fullest target with the
        # smallest ``per_target`` and all the leases with the smallest
        # ``running``: no intent can then be held back. Counted per target, a
        # ``per_target`` far above the busiest partner's share keeps the claim
        # plain; one count of every lease against it made a pool with 64 in
        # flight claim exactly under ``per_target`` 64 (docs/benchmarks.md).
        gate = (
            f"WITH room AS MATERIALIZED (SELECT spare >= %s AS ok, spare FROM (SELECT "
            f"LEAST(%s - COALESCE(max(n), 0), %s - COALESCE(sum(n), 0))::bigint AS spare "
            f"FROM (SELECT count(*) AS n FROM {table} WHERE state = '{RUNNING}' "
            f"AND claim_until > %s AND kind = ANY (%s::text[]) GROUP BY kind, target) AS live) "
            f"AS counted), "
        )

        def gated(plain: str) -> str:
            ctes, update = plain.removeprefix("WITH ").rsplit(" UPDATE ", 1)
            ctes = ctes.replace("{filters}", " AND (SELECT ok FROM room){filters}")
            return (
                f"{gate}{ctes}, claimed AS (UPDATE {update}) "
                f"SELECT claimed.*, room.ok, room.spare FROM room LEFT JOIN claimed ON true"
            )

        self.sql_roomy_claim = gated(self.sql_claim)
        self.sql_roomy_claim_zero = gated(self.sql_claim_zero)
        # unnest keeps the array's order, so the locks are taken in the order
        # given. The flag says whether intents of the kinds at other priorities
        # are pending and due, for the next exact claim (``claim_exactly``): the
        # first such intent in each small partial index of those priorities,
        # found as the claim's branches find theirs, in the index's own order.
        # Not EXISTS, which drops ORDER BY and LIMIT: with statistics from a
        # time when most intents had another priority, the planner answered it
        # from the claim index, reading every due intent (so did it from the
        # (kind, state) index with the kinds as "kind = ANY (...)", 13 ms per
        # claim with a relay's backlog of 20,000); array_position, which no
        # index answers, keeps the kinds out of the choice (``kind_filter``).
        others = " OR ".join(
            f"(SELECT true FROM {table} WHERE state = '{PENDING}' AND {branch.where} "
            f"AND next_at <= %s AND array_position(%s::text[], kind::text) IS NOT NULL "
            f"{branch.order} LIMIT 1) IS NOT NULL"
            for branch in BRANCHES
            if not branch.floored
        )
        self.sql_limit_lock = (
            f"SELECT count(pg_advisory_xact_lock(k)), {others}, {NO_BITMAPS} "
            f"FROM unnest(%s::bigint[]) AS k"
        )
        self.sql_limit_lock_only = (
            f"SELECT count(pg_advisory_xact_lock(k)), {NO_BITMAPS} FROM unnest(%s::bigint[]) AS k"
        )

    def candidate_queries(
        self: PostgreSQLBackend,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        zero: bool = False,
    ) -> list[tuple[str, list[Any]]]:
        """The limited claim, of every branch or of priority 0 alone; its parameters
        end before the token salt, the lease end, the update time and the limit."""
        kinds, per_target, running = caps_of(filters)
        fetch = min(limit * EXTRA, limit + MAX_EXTRA_ROWS, MAX_LIMIT)
        capped = any(cap is not None for cap in running)
        where, filter_params = self.filters(filters, paused=False)
        at = self.dt(now)
        if zero and self.probes(filters):  # the held-back head's, then priority 0 from it
            statement = self.sql_limited_claim_head[capped].replace("{filters}", where)
            levels = self.held_head(filters)
            params = [
                *heldhead.parameters(levels, filters.since, self.dt),
                *[at, at, *filter_params] * 2,
                fetch,
            ]
        elif zero:  # one branch: its parameters as branched() gives the branch of priority 0
            floor, floor_params = self.floor(filters)
            statement = self.sql_limited_claim_zero[capped].replace("{filters}", where)
            statement = statement.replace(FLOOR, floor)
            params = [at, at, *filter_params, *floor_params, fetch]
        else:
            statement, params = self.branched(
                self.sql_limited_claim[capped], now=now, filters=filters, tail=[fetch], paused=False
            )
        return [(statement, [self.dt(now), kinds, kinds, per_target, running, *params])]

    def claim_limited(
        self: PostgreSQLBackend,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        tail: list[Any],
        riders: Riders | None = None,
    ) -> Claims[Any]:
        """Lock the kinds, then claim: plainly while they have room, else exactly.

        While the fullest target of the limited kinds has room for the whole
        claim under the smallest ``per_target``, and all their live leases
        under the smallest ``running``, no intent can be held back, so the
        claim is a plain one gated by those counts (``sql_roomy_claim``), half
        the cost of the exact one, and it says that it held nothing back
        (``Claims``). Its priorities are as
        ``PostgreSQLBackend.claim_by_priority``'s. A claim three quarters of
        which fit claims plainly what fits (``Claims.bound`` false: no target
        was near its cap). One that finds less room takes the exact
        statement, and so do the claims of the next ``TIGHT_FOR`` seconds,
        rather than trying the plain one first.
        """
        key = ("limited", *sorted(filters.limits))
        heard = self._heard
        if time.monotonic() >= self._tight.get(key, 0.0):
            zero = filters.since is not None and not self._others_due.get(key, True)
            statement, params = self.roomy_query(now=now, limit=limit, filters=filters, zero=zero)
            found, _ = self.locked(statement, [*params, *tail], filters=filters, riders=riders)
            if found[0][-2]:  # room for the whole claim
                rows = [row[:-2] for row in found if row[0] is not None]
                if not zero:
                    priority = self.columns.index("priority")
                    self.settle_others(key, heard, any(row[priority] != 0 for row in rows))
                elif 0 < len(rows) < limit:  # priority 0 ran out: the next claim walks every
                    self._others_due[key] = True  # priority (``claim_by_priority``)
                return Claims(rows)
            spare = found[0][-1]
            if spare * 4 >= limit * 3:
                # Three quarters of the claim or more fit: a pool whose queue
                # has just grown asked for more than the fullest target leaves
                # under a cap far above its share. A plain claim of what fits
                # costs half the exact one, and the claims after it stay plain.
                fewer = self.claim_limited(now=now, limit=spare, filters=filters, tail=tail)
                # The rest was not asked for: held back for the floor, but no
                # target was near its cap.
                return Claims(fewer, held_back=True, bound=fewer.bound)
            self._tight[key] = time.monotonic() + TIGHT_FOR
        return self.claim_exactly(now=now, limit=limit, filters=filters, tail=tail, riders=riders)

    def claim_exactly(
        self: PostgreSQLBackend,
        *,
        now: datetime,
        limit: int,
        filters: ClaimFilters,
        tail: list[Any],
        riders: Riders | None = None,
    ) -> Claims[Any]:
        """The exact limited claim (``sql_limited_claim``), of priority 0 alone while
        no other is due.

        The flag that says so comes from the lock's statement, so it is known
        even when every target is full and the claim takes nothing: a claim
        of a limited kind takes an intent of another priority by the claim
        after the one that saw it due.
        """
        key = ("limited", *sorted(filters.limits))
        heard = self._heard
        zero = not self._others_due.get(key, True)
        probed = zero and self.probes(filters)
        [(statement, params)] = self.candidate_queries(
            now=now, limit=limit, filters=filters, zero=zero
        )
        lock = (self.sql_limit_lock, [*[self.dt(now), sorted(filters.limits)] * 2])
        rows, (_, others, _) = self.locked(
            statement, [*params, *tail, limit], filters=filters, lock=lock, riders=riders
        )
        oldest_due = None
        if probed:
            width = heldhead.INFO_COLUMNS
            info = tuple(rows[0][-width:])
            levels = heldhead.advanced(self.held_head(filters), info)
            self._held_heads[heldhead.key_of(filters)] = levels
            rows = [row[:-width] for row in rows if row[0] is not None]
            if filters.since is None:
                # Its head is the first due intent of priority 0; a live lease
                # that expires makes its intent due again, in its old place.
                oldest_due = min(at for at in (info[1], info[-1], now) if at is not None)
        priority = self.columns.index("priority")
        self.settle_others(key, heard, others or any(row[priority] != 0 for row in rows))
        if zero and others and len(rows) < limit:
            rest = self.claim_exactly(now=now, limit=limit - len(rows), filters=filters, tail=tail)
            rows += rest
        return Claims(rows, held_back=True, oldest_due=oldest_due)

    def locked(
        self: PostgreSQLBackend,
        statement: str,
        params: list[Any],
        *,
        filters: ClaimFilters,
        lock: tuple[str, list[Any]] | None = None,
        riders: Riders | None = None,
    ) -> tuple[list[Any], Any]:
        """``statement`` run after the kinds' advisory locks, in one transaction and one
        round trip (``one_round_trip``): its rows, and the lock statement's one row.

        The first of a claim's statements completes its ``riders`` before the
        locks, so that the places they held are free for the claim (the live
        leases it counts are read after them, in the same transaction).
        """
        lock_statement, lock_params = lock or (self.sql_limit_lock_only, [])
        keys = sorted(lock_key(kind) for kind in filters.limits)
        riding = riders if riders is not None and riders.pairs and not riders.sent else None
        with self.cursor() as done, self.cursor() as locks, self.cursor() as cursor:
            with self.one_round_trip():
                if riding is not None:
                    ids, tokens = (list(column) for column in zip(*riding.pairs, strict=True))
                    done.execute(self.sql_complete_many, [riding.at, ids, tokens])
                locks.execute(lock_statement, [*lock_params, keys])
                cursor.execute(statement, params)
            if riding is not None:
                riding.done, riding.sent = [(row[0], row[1]) for row in done.fetchall()], True
            return cursor.fetchall(), locks.fetchone()

    def probes(self: PostgreSQLBackend, filters: ClaimFilters) -> bool:
        """Whether an exact claim of priority 0 looks for the held-back head: a full
        claim does, to find it; one above the floor, to keep one it remembers."""
        return filters.since is None or bool(self.held_head(filters))

    def held_head(self: PostgreSQLBackend, filters: ClaimFilters) -> list[heldhead.Level]:
        """The held-back head a claim above the floor starts past; a full claim
        (no floor) walks from the start and makes it anew."""
        if filters.since is None:
            return []
        return self._held_heads.get(heldhead.key_of(filters), [])

    def roomy_query(
        self: PostgreSQLBackend, *, now: datetime, limit: int, filters: ClaimFilters, zero: bool
    ) -> tuple[str, list[Any]]:
        """``sql_roomy_claim`` (or ``_zero``) and its parameters, less the token salt,
        the lease end and the update time."""
        kinds, per_target, running = caps_of(filters)
        gate = [limit, smallest(per_target), smallest(running), self.dt(now), kinds]
        if zero:
            template = self.sql_roomy_claim_zero
            statement, params = self.zero_claim_query(
                now=now, limit=limit, filters=filters, template=template
            )
            return statement, [*gate, *params]
        statement, params = self.branched(
            self.sql_roomy_claim, now=now, filters=filters, tail=[limit]
        )
        return statement, [*gate, *params, limit]


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
