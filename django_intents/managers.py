"""Reads on the QuerySet, transitions on the manager: one method per SPEC §3 verb.

Every transition is one guarded statement whose success is read from what it
touched, so two callers racing for the same intent cannot both win. Fenced
methods match ``claim_token`` as well as the state: a worker whose lease was
taken over holds a token that no longer matches anything.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from . import sql
from .conf import get_settings
from .identity import check_id, check_text, digest
from .retries import backoff
from .signals import intents_rescued, intents_transitioned

if TYPE_CHECKING:
    from .models import Intent

ORDER = ("next_at", "created_at", "id")
STATES = ("pending", "running", "completed", "cancelled")
INSERT_BATCH = 500
MAX_ERROR_LENGTH = 10_000
MAX_LIMIT = 2**63 - 1  # the largest LIMIT that SQLite, PostgreSQL and MariaDB all accept
ITEM_KEYS = frozenset({"kind", "event_id", "target", "payload", "next_at", "id"})


class IntentQuerySet(models.QuerySet["Intent"]):
    def active(self) -> IntentQuerySet:
        return self.filter(state__in=("pending", "running"))

    def terminal(self) -> IntentQuerySet:
        return self.filter(state__in=("completed", "cancelled"))

    def pending(self, kind: str | None = None) -> IntentQuerySet:
        """Intents not yet finished (``pending`` or ``running``), in claim order."""
        qs = self.active()
        if kind is not None:
            qs = qs.filter(kind=check_text("kind", kind))
        return qs.order_by(*ORDER)

    def in_state(self, state: str | None = None) -> IntentQuerySet:
        if state is None:
            return self.order_by(*ORDER)
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        return self.filter(state=state).order_by(*ORDER)

    def due(self, now: datetime | None = None) -> IntentQuerySet:
        """Intents a claim at ``now`` could take: due pending ones and expired leases."""
        now = _now(now)
        return self.filter(
            models.Q(state="pending", next_at__lte=now)
            | models.Q(state="running", claim_until__lte=now)
        ).order_by(*ORDER)

    def expired(self, now: datetime | None = None) -> IntentQuerySet:
        return self.filter(state="running", claim_until__lte=_now(now))


class IntentManager(models.Manager.from_queryset(IntentQuerySet)):  # type: ignore[misc]
    # -- enqueue -------------------------------------------------------------

    def enqueue(
        self,
        kind: str,
        event_id: str,
        target: str,
        payload: Any = None,
        *,
        next_at: datetime | None = None,
        id: str | None = None,  # noqa: A002 - SPEC §3 names it
        now: datetime | None = None,
    ) -> str:
        """Record an intent in the caller's transaction; a known id is left as it is."""
        now = _now(now)
        row = self._row(kind, event_id, target, payload, next_at, id, now, label="")
        self._insert([row])
        return str(row["id"])

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, now: datetime | None = None
    ) -> list[str]:
        """Record many intents; every item is checked before anything is written."""
        now = _now(now)
        if isinstance(items, Mapping | str | bytes):
            raise TypeError("items must be an iterable of dicts, not a single value")
        rows = []
        for index, item in enumerate(items):
            label = f"items[{index}]: "
            if not isinstance(item, Mapping):
                raise TypeError(f"{label}must be a dict, not {type(item).__name__}")
            unknown = set(item) - ITEM_KEYS
            if unknown:
                raise ValueError(f"{label}unknown keys {sorted(map(str, unknown))}")
            missing = [key for key in ("kind", "event_id", "target") if key not in item]
            if missing:
                raise ValueError(f"{label}missing {', '.join(missing)}")
            rows.append(
                self._row(
                    item["kind"],
                    item["event_id"],
                    item["target"],
                    item.get("payload"),
                    item.get("next_at"),
                    item.get("id"),
                    now,
                    label=label,
                )
            )
        unique = list({row["id"]: row for row in reversed(rows)}.values())[::-1]
        batches = [unique[i : i + INSERT_BATCH] for i in range(0, len(unique), INSERT_BATCH)]
        if len(batches) > 1:
            with transaction.atomic(using=self._alias()):
                for batch in batches:
                    self._insert(batch)
        elif batches:
            self._insert(batches[0])
        return [str(row["id"]) for row in rows]

    def _row(
        self,
        kind: Any,
        event_id: Any,
        target: Any,
        payload: Any,
        next_at: Any,
        id: Any,  # noqa: A002
        now: datetime,
        label: str,
    ) -> dict[str, Any]:
        try:
            kind, event_id, target = (
                check_text("kind", kind),
                check_text("event_id", event_id),
                check_text("target", target),
            )
            return {
                "id": digest(kind, event_id, target) if id is None else check_id(id),
                "kind": kind,
                "event_id": event_id,
                "target": target,
                "payload": _check_json(payload, "payload"),
                "state": "pending",
                "attempts": 0,
                "next_at": now if next_at is None else _aware("next_at", next_at),
                "created_at": now,
                "updated_at": now,
                "last_error": "",
                "claim_token": "",
                "claim_until": None,
            }
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{label}{exc}") from None

    def _insert(self, rows: Sequence[dict[str, Any]]) -> None:
        conn = self._connection()
        st = sql.statements(conn)
        if st.insert_json and len(rows) > 1:
            # One row gains nothing from the JSON form: its VALUES text is short
            # enough for the client to cache, and the server parses no JSON.
            now = rows[0]["created_at"]  # the same for every row of a batch
            statement = st.insert_json
            params = [*[_dt(conn, now)] * sql.JSON_NOW_PARAMS, _json_rows(rows, now)]
        else:
            prepared = [_db_values(conn, st, row) for row in rows]
            statement = st.insert.replace("{rows}", ", ".join([st.values_group()] * len(rows)))
            params = [value for row in prepared for value in row]
        with sql.cursor(conn) as cursor:
            cursor.execute(statement, params)
            if conn.vendor == "postgresql":  # a row per kind, with its count
                kinds = [kind for kind, count, _ in cursor.fetchall() for _ in range(count)]
            else:
                kinds = [kind for (kind,) in cursor.fetchall()]
        _announce(conn, "pending", kinds)

    # -- claim ---------------------------------------------------------------

    def claim(
        self,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Intent | None:
        """Claim the oldest due intent, or return ``None`` when nothing is due."""
        claimed = self.claim_many(1, now=now, lease=lease, kinds=kinds)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        limit: int,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
        kinds: Iterable[str] | None = None,
        since: datetime | None = None,
    ) -> list[Intent]:
        """Claim up to ``limit`` due intents in claim order, in one transaction.

        ``since`` leaves out intents whose ``next_at`` is earlier. A pool passes
        it so that its claims start where the live rows start instead of
        stepping over the index entries that finished rows leave behind until
        PostgreSQL's VACUUM removes them (docs/workers.md, "claim floor").
        With ``MAX_ATTEMPTS``, cancelling expired leases that used their last
        attempt is left to a claim without ``since``: one statement fewer on
        most of a pool's claims, and such a lease is never claimed meanwhile.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        limit = min(limit, MAX_LIMIT)
        now = _now(now)
        until = _later(now, _lease(lease), "lease")
        kind_list = _kinds(kinds)
        if since is not None:
            since = _aware("since", since)
        if kind_list == []:
            return []
        conn = self._connection()
        st = sql.statements(conn)
        max_attempts = get_settings().max_attempts
        if max_attempts is not None and since is None:
            # A claim above a floor leaves this to the pool's next full claim:
            # the filter below keeps it from claiming an exhausted lease meanwhile.
            self._cancel_exhausted(conn, st, now, max_attempts, kind_list)
        filters, params = _filters(conn, kind_list, since)
        if max_attempts is not None:
            filters += " AND (state = 'pending' OR attempts < %s)"
            params.append(max_attempts)
        if conn.vendor == "postgresql":
            claimed = self._claim_returning(conn, st, now, until, limit, filters, params)
        else:
            claimed = self._claim_select_update(conn, st, now, until, limit, filters, params)
        claimed.sort(key=lambda pair: (pair[0].next_at, pair[0].created_at, pair[0].id))
        _announce(conn, "running", [intent.kind for intent, _ in claimed])
        rescued = [
            (intent.kind, (now - lease_end).total_seconds())
            for intent, lease_end in claimed
            if lease_end is not None
        ]
        if rescued and intents_rescued.has_listeners(_model()):
            _after_commit(conn, lambda: intents_rescued.send(sender=_model(), rescued=rescued))
        return [intent for intent, _ in claimed]

    def _claim_returning(
        self,
        conn: BaseDatabaseWrapper,
        st: sql.Statements,
        now: datetime,
        until: datetime,
        limit: int,
        filters: str,
        params: list[Any],
    ) -> list[tuple[Intent, datetime | None]]:
        at, until_db = _dt(conn, now), _dt(conn, until)
        statement = st.claim_pg.replace("{filters}", filters)
        args = [at, at, *params, limit, secrets.token_hex(16), until_db, at]
        with sql.cursor(conn) as cursor:
            cursor.execute(statement, args)
            rows = cursor.fetchall()
        width = len(st.columns)
        intents = _from_rows(conn, st, [row[:width] for row in rows])
        return [
            (intent, row[width + 1] if row[width] == "running" else None)
            for intent, row in zip(intents, rows, strict=True)
        ]

    def _claim_select_update(
        self,
        conn: BaseDatabaseWrapper,
        st: sql.Statements,
        now: datetime,
        until: datetime,
        limit: int,
        filters: str,
        params: list[Any],
    ) -> list[tuple[Intent, datetime | None]]:
        at = _dt(conn, now)
        with _write_transaction(conn), sql.cursor(conn) as cursor:
            if conn.vendor == "mysql":
                cursor.execute(st.claim_select.replace("{filters}", filters), [at, *params, limit])
                rows = cursor.fetchall()
                cursor.execute(st.claim_expired.replace("{filters}", filters), [at, *params, limit])
                rows += cursor.fetchall()
            else:
                statement = st.claim_select.replace("{filters}", filters)
                cursor.execute(statement, [at, at, *params, limit])
                rows = cursor.fetchall()
            if not rows:
                return []
            intents = sorted(
                _from_rows(conn, st, rows), key=lambda i: (i.next_at, i.created_at, i.id)
            )[:limit]
            tokens = {intent.id: secrets.token_hex(16) for intent in intents}
            cases = " ".join(["WHEN %s THEN %s"] * len(tokens))
            cursor.execute(
                f"UPDATE {st.table} SET state = 'running', attempts = attempts + 1, "
                f"claim_token = CASE id {cases} END, claim_until = %s, updated_at = %s "
                f"WHERE {sql.in_list('id', len(tokens))} AND {sql.ACTIVE}",
                [*(v for pair in tokens.items() for v in pair), _dt(conn, until), at, *tokens],
            )
        claimed: list[tuple[Intent, datetime | None]] = []
        for intent in intents:
            lease_end = intent.claim_until if intent.state == "running" else None
            intent.state = "running"
            intent.attempts += 1
            intent.claim_token = tokens[intent.id]
            intent.claim_until = until
            intent.updated_at = now
            claimed.append((intent, lease_end))
        return claimed

    def _cancel_exhausted(
        self,
        conn: BaseDatabaseWrapper,
        st: sql.Statements,
        now: datetime,
        max_attempts: int,
        kinds: list[str] | None,
    ) -> None:
        """Cancel expired leases that used the last attempt, so a crash loop ends."""
        at = _dt(conn, now)
        message = f"lease expired on the last allowed attempt (MAX_ATTEMPTS={max_attempts})"
        filters, params = sql.kind_filter(kinds)
        if st.returning:
            statement = st.exhausted_cancel.replace("{where}", "AND attempts >= %s" + filters)
            with sql.cursor(conn) as cursor:
                cursor.execute(statement, [message, at, at, max_attempts, *params])
                cancelled = [row[0] for row in cursor.fetchall()]
        else:
            with transaction.atomic(using=conn.alias), sql.cursor(conn) as cursor:
                cursor.execute(
                    st.exhausted_select.replace("{filters}", filters), [at, max_attempts, *params]
                )
                found = cursor.fetchall()
                if found:
                    where = "AND " + sql.in_list("id", len(found))
                    cursor.execute(
                        st.exhausted_cancel.replace("{where}", where),
                        [message, at, at, *(row[0] for row in found)],
                    )
                cancelled = [row[1] for row in found]
        _announce(conn, "cancelled", cancelled)

    def has_due(
        self,
        *,
        now: datetime | None = None,
        kinds: Iterable[str] | None = None,
        since: datetime | None = None,
    ) -> bool:
        """Whether a claim at ``now`` would find an intent: one index lookup, no lock, no write.

        Lets a poller on SQLite, where every claim takes the database's one
        write lock, look before it claims. ``since`` is as for ``claim_many``.
        """
        now = _now(now)
        kind_list = _kinds(kinds)
        if since is not None:
            since = _aware("since", since)
        if kind_list == []:
            return False
        conn = self._connection()
        st = sql.statements(conn)
        at = _dt(conn, now)
        filters, params = _filters(conn, kind_list, since)
        with sql.cursor(conn) as cursor:
            if conn.vendor == "mysql":
                for branch in sql.DUE_BRANCHES:
                    statement = st.due_probe.replace("{branch}", branch)
                    cursor.execute(statement.replace("{filters}", filters), [at, *params])
                    if cursor.fetchone() is not None:
                        return True
                return False
            cursor.execute(st.due_probe.replace("{filters}", filters), [at, at, *params])
            return cursor.fetchone() is not None

    # -- fenced transitions ----------------------------------------------------

    def renew(
        self,
        id: str,  # noqa: A002
        claim_token: str,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
    ) -> bool:
        """Extend the lease of a claim this caller still holds."""
        now = _now(now)
        until = _later(now, _lease(lease), "lease")
        conn = self._connection()
        args = [_dt(conn, until), _dt(conn, now), check_id(id), _token(claim_token)]
        with sql.cursor(conn) as cursor:
            cursor.execute(sql.statements(conn).renew, args)
            return bool(cursor.rowcount)

    def complete(self, id: str, claim_token: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        conn = self._connection()
        args = [_dt(conn, _now(now)), check_id(id), _token(claim_token)]
        return self._transition(conn, sql.statements(conn).complete, args, id, "completed")

    def complete_many(
        self, pairs: Iterable[tuple[str, str]], *, now: datetime | None = None
    ) -> list[str]:
        """Complete every ``(id, claim_token)`` claim still held; return the ids completed.

        The batch form of ``complete`` for workers that finish many intents at
        once: one statement per ``INSERT_BATCH`` pairs instead of one per
        intent, each fenced exactly as ``complete`` is, so a pair whose claim
        was lost is left alone and missing from the result.
        """
        now = _now(now)
        if isinstance(pairs, str | bytes):
            raise TypeError("pairs must be an iterable of (id, claim_token) pairs")
        checked = list(dict.fromkeys((check_id(id), _token(token)) for id, token in pairs))
        if not checked:
            return []
        conn = self._connection()
        st = sql.statements(conn)
        at = _dt(conn, now)
        batches = [checked[i : i + INSERT_BATCH] for i in range(0, len(checked), INSERT_BATCH)]
        done: list[tuple[str, str]] = []
        with transaction.atomic(using=conn.alias) if len(batches) > 1 else _nothing():
            for batch in batches:
                done += self._complete_batch(conn, st, at, batch)
        _announce(conn, "completed", [kind for _, kind in done])
        completed = {id for id, _ in done}
        return list(dict.fromkeys(id for id, _ in checked if id in completed))

    def _complete_batch(
        self,
        conn: BaseDatabaseWrapper,
        st: sql.Statements,
        at: Any,
        pairs: list[tuple[str, str]],
    ) -> list[tuple[str, str]]:
        """Complete one batch; return ``(id, kind)`` of the intents completed."""
        if conn.vendor == "postgresql":
            with sql.cursor(conn) as cursor:
                cursor.execute(st.complete_many, [at, [p[0] for p in pairs], [p[1] for p in pairs]])
                return [(row[0], row[1]) for row in cursor.fetchall()]
        ids = list(dict.fromkeys(id for id, _ in pairs))
        if st.returning:
            statement = st.complete_many.replace("{ids}", ", ".join(["%s"] * len(ids)))
            statement = statement.replace("{pairs}", ", ".join(["(%s, %s)"] * len(pairs)))
            args = [at, *ids, *(value for pair in pairs for value in pair)]
            with sql.cursor(conn) as cursor:
                cursor.execute(statement, args)
                return [(row[0], row[1]) for row in cursor.fetchall()]
        wanted = set(pairs)
        with transaction.atomic(using=conn.alias), sql.cursor(conn) as cursor:
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(st.complete_many_lock.replace("{ids}", marks), ids)
            held = [(id, kind) for id, kind, token in cursor.fetchall() if (id, token) in wanted]
            if held:
                marks = ", ".join(["%s"] * len(held))
                cursor.execute(
                    st.complete_many.replace("{ids}", marks), [at, *(id for id, _ in held)]
                )
        return held

    def retry(
        self,
        id: str,  # noqa: A002
        claim_token: str,
        cause: object = None,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Give the intent back for a later attempt, or cancel it once attempts run out."""
        now = _now(now)
        id, claim_token = check_id(id), _token(claim_token)
        conn = self._connection()
        st = sql.statements(conn)
        with sql.cursor(conn) as cursor:
            cursor.execute(st.attempts_of, [id, claim_token])
            row = cursor.fetchone()
        if row is None:
            return False
        # attempts only changes when a claim replaces the token, so the fence
        # below also guarantees the count read here is still the current one.
        attempts, max_attempts = row[0], get_settings().max_attempts
        error = _error_text(cause)
        if max_attempts is not None and attempts >= max_attempts:
            args = [error, _dt(conn, now), id, claim_token]
            return self._transition(conn, st.cancel_claim, args, id, "cancelled")
        next_at = _later(now, backoff(id, attempts), "backoff")
        args = [_dt(conn, next_at), error, _dt(conn, now), id, claim_token]
        return self._transition(conn, st.retry, args, id, "pending")

    def cancel_claim(
        self,
        id: str,  # noqa: A002
        claim_token: str,
        cause: object = None,
        *,
        now: datetime | None = None,
    ) -> bool:
        """End the intent for good: the handler said it can never succeed."""
        conn = self._connection()
        args = [_error_text(cause), _dt(conn, _now(now)), check_id(id), _token(claim_token)]
        return self._transition(conn, sql.statements(conn).cancel_claim, args, id, "cancelled")

    def release(
        self,
        id: str,  # noqa: A002
        claim_token: str,
        *,
        now: datetime | None = None,
    ) -> bool:
        """Hand an unfinished claim back: ``pending`` and due now, ``attempts`` kept.

        A worker shutting down releases the intents its handlers did not finish,
        so they run again at once instead of waiting for the lease to expire.
        """
        conn = self._connection()
        at = _dt(conn, _now(now))
        args = [at, at, check_id(id), _token(claim_token)]
        return self._transition(conn, sql.statements(conn).release, args, id, "pending")

    def complete_pending(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Mark a pending intent done because the caller did the work inline."""
        conn = self._connection()
        args = [_dt(conn, _now(now)), check_id(id)]
        return self._transition(conn, sql.statements(conn).complete_pending, args, id, "completed")

    # -- administrative --------------------------------------------------------

    def retry_now(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Make an unfinished intent due now; a current claimant loses its claim."""
        conn = self._connection()
        at = _dt(conn, _now(now))
        return self._transition(
            conn, sql.statements(conn).retry_now, [at, at, check_id(id)], id, "pending"
        )

    def cancel(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Cancel an unfinished intent; a current claimant loses its claim."""
        conn = self._connection()
        args = [_dt(conn, _now(now)), check_id(id)]
        return self._transition(conn, sql.statements(conn).cancel, args, id, "cancelled")

    # -- plumbing --------------------------------------------------------------

    def _transition(
        self,
        conn: BaseDatabaseWrapper,
        statement: str,
        args: list[Any],
        id: str,
        to: str,  # noqa: A002
    ) -> bool:
        st = sql.statements(conn)
        with sql.cursor(conn) as cursor:
            cursor.execute(statement, args)
            if st.returning:
                kinds = [row[0] for row in cursor.fetchall()]
            elif cursor.rowcount:
                cursor.execute(st.kind_of, [id])
                kinds = [row[0] for row in cursor.fetchall()]
            else:
                kinds = []
        _announce(conn, to, kinds)
        return bool(kinds)

    def _alias(self) -> str:
        return self._db or router.db_for_write(self.model)

    def _connection(self) -> BaseDatabaseWrapper:
        return connections[self._alias()]


# -- helpers -----------------------------------------------------------------


def _model() -> type[Intent]:
    from .models import Intent

    return Intent


def _now(now: Any) -> datetime:
    return timezone.now() if now is None else _aware("now", now)


def _aware(name: str, value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if timezone.is_naive(value):
        raise ValueError(f"{name} must be an aware datetime (USE_TZ), not naive {value}")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{name} {value} is outside the calendar once converted to UTC") from None
    return value


def _later(now: datetime, delta: timedelta, name: str) -> datetime:
    try:
        return now + delta
    except OverflowError:
        raise ValueError(f"{name} {delta} from {now} ends after the year 9999") from None


def _lease(lease: Any) -> timedelta:
    if lease is None:
        return timedelta(seconds=get_settings().lease)
    if isinstance(lease, timedelta):
        seconds = lease.total_seconds()
    elif isinstance(lease, int | float) and not isinstance(lease, bool):
        seconds = lease
    else:
        raise TypeError(f"lease must be seconds or a timedelta, not {type(lease).__name__}")
    if not 0 < seconds < math.inf:
        raise ValueError(f"lease must be a positive duration, not {lease!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"lease must be shorter than {timedelta.max}, not {lease!r}") from None


def _filters(
    conn: BaseDatabaseWrapper, kinds: list[str] | None, since: datetime | None
) -> tuple[str, list[Any]]:
    """The claim's optional conditions: a floor on ``next_at``, then the kinds."""
    filters, params = sql.kind_filter(kinds, conn.vendor)
    if since is None:
        return filters, params
    return " AND next_at >= %s" + filters, [_dt(conn, since), *params]


def _kinds(kinds: Any) -> list[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str | bytes):
        raise TypeError("kinds must be a collection of kind names, not a single string")
    return sorted({check_text("kind", kind) for kind in kinds})


def _token(token: Any) -> str:
    if not isinstance(token, str):
        raise TypeError(f"claim_token must be a string, not {type(token).__name__}")
    if "\x00" in token:
        raise ValueError("claim_token must not contain NUL characters")
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("claim_token is not valid Unicode text (lone surrogate)") from None
    return token


def _error_text(cause: object) -> str:
    """``str(cause)``, made storable: no NUL, no lone surrogates, bounded length."""
    if cause is None:
        return ""
    text = str(cause).replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def _check_json(value: Any, path: str) -> Any:
    """Refuse what would not read back exactly: only JSON's own types are stored."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}, which JSON cannot represent")
        return value
    if isinstance(value, str):
        return check_json_text(value, path)
    if isinstance(value, list):
        return [_check_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{path} has key {key!r}; JSON object keys must be strings")
            check_json_text(key, f"{path} key")
        return {key: _check_json(item, f"{path}[{key!r}]") for key, item in value.items()}
    raise TypeError(f"{path} is a {type(value).__name__}, which is not a JSON value")


def check_json_text(value: str, path: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{path} contains a NUL character, which databases refuse in JSON")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path} contains a lone surrogate and is not valid Unicode") from None
    return value


def _dt(conn: BaseDatabaseWrapper, value: datetime) -> Any:
    return conn.ops.adapt_datetimefield_value(value)


def _db_values(conn: BaseDatabaseWrapper, st: sql.Statements, row: dict[str, Any]) -> list[Any]:
    payload = _model()._meta.get_field("payload")
    values = []
    for column in st.columns:
        value = row[column]
        if column == "payload":
            value = payload.get_db_prep_save(value, conn)
        elif isinstance(value, datetime):
            value = _dt(conn, value)
        values.append(value)
    return values


def _json_rows(rows: Sequence[dict[str, Any]], now: datetime) -> str:
    """The rows as one JSON array for ``insert_json``; payloads were checked by ``_check_json``.

    ``next_at`` is left out where it is the batch's ``now``, which the
    statement takes as a parameter.
    """
    items = []
    for row in rows:
        item = {column: row[column] for column in sql.JSON_COLUMNS if column != "next_at"}
        if row["next_at"] is not now:
            item["next_at"] = row["next_at"].isoformat()
        items.append(item)
    return json.dumps(items)


def _from_rows(
    conn: BaseDatabaseWrapper, st: sql.Statements, rows: Sequence[Sequence[Any]]
) -> list[Intent]:
    """Build model instances from raw rows, with the same conversions the ORM applies."""
    model = _model()
    fields = model._meta.concrete_fields
    converters = []
    for field in fields:
        col = field.get_col(model._meta.db_table)
        converters.append(conn.ops.get_db_converters(col) + field.get_db_converters(conn))
    names = [field.attname for field in fields]
    intents = []
    for row in rows:
        values = list(row)
        for i, funcs in enumerate(converters):
            for func in funcs:
                values[i] = func(values[i], fields[i], conn)
        intents.append(model.from_db(conn.alias, names, values))
    return intents


def _announce(conn: BaseDatabaseWrapper, to: str, kinds: list[str]) -> None:
    """Tell receivers (metrics) about transitions once they are committed."""
    if not kinds or not intents_transitioned.has_listeners(_model()):
        return

    _after_commit(conn, lambda: intents_transitioned.send(sender=_model(), to=to, kinds=kinds))


def _after_commit(conn: BaseDatabaseWrapper, send: Callable[[], object]) -> None:
    """Send now outside a transaction; inside one, once it commits, never if it rolls back."""
    if conn.in_atomic_block:
        transaction.on_commit(send, using=conn.alias)
    else:
        send()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _write_transaction(conn: BaseDatabaseWrapper) -> Iterator[None]:
    """A transaction that takes the write lock first.

    SQLite allows one writer; a deferred transaction that reads and then writes
    can fail at once with "database is locked", while ``BEGIN IMMEDIATE`` waits
    for the busy timeout instead. Inside a caller's transaction, that one is used.
    """
    if conn.vendor != "sqlite":
        with transaction.atomic(using=conn.alias):
            yield
        return
    if conn.in_atomic_block:
        yield
        return
    conn.ensure_connection()
    with sql.cursor(conn) as cursor:
        cursor.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")
