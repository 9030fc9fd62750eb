"""Between the intent table's rows and Python: what the ORM would do, without the ORM.

A backend writes and reads rows with raw SQL for speed; these apply the same
conversions Django would, so that what a claim returns equals what
``Intent.objects.get`` would.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from django_intents.rules.states import State

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow
    from django_intents.store.claims import Claimed
    from django_intents.store.table import Table

RUNNING = State.RUNNING.value


def to_values(table: Table, rows: Sequence[dict[str, Any]]) -> list[Any]:
    """The rows' values in column order, as the database takes them, in one flat list.

    The connection and its adapters are looked up once: on a batch of 500
    rows, once per value cost a sixth of ``enqueue_many``'s time.
    """
    connection = table.connection
    adapt = connection.ops.adapt_datetimefield_value
    payload: Any = table.model._meta.get_field("payload")
    prepare = payload.get_db_prep_save
    values = []
    for row in rows:
        for column in table.columns:
            value = row[column]
            if column == "payload":
                value = prepare(value, connection)
            elif isinstance(value, datetime):
                value = adapt(value)
            values.append(value)
    return values


def hydrate(table: Table, rows: Sequence[Sequence[Any]]) -> list[IntentRow]:
    """Model instances from raw rows, with the same conversions the ORM applies.

    While nobody listens to ``pre_init`` or ``post_init`` for the model, an
    instance is built as ``Model.__init__`` would leave it (the intent's fields
    are plain attributes, set in its ``__dict__``) without the call: on a
    pool's claim of hundreds, ``from_db`` was a third of the loop's time.
    """
    conn, model, fields = table.connection, table.model, table.fields
    converters: list[tuple[int, Any, Any]] = []
    for i, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        funcs = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
        converters.extend((i, _text_times(conn, func), field) for func in funcs)
    names = [field.attname for field in fields]
    observed = pre_init.has_listeners(model) or post_init.has_listeners(model)
    intents: list[Any] = []
    for row in rows:
        values = list(row)
        for i, func, field in converters:
            values[i] = func(values[i], field, conn)
        if observed:
            intents.append(model.from_db(table.alias, names, values))
            continue
        intent = model.__new__(model)
        intent.__dict__.update(zip(names, values, strict=True))
        intent._state = state = ModelState()
        state.adding, state.db = False, table.alias
        intents.append(intent)
    return intents


def _text_times(conn: Any, func: Any) -> Any:
    """SQLite's converter of a ``DateTimeField``, quicker on the text SQLite stores.

    Django's parses with ``parse_datetime`` (``datetime.fromisoformat`` first)
    and makes a naive result aware in the connection's zone when ``USE_TZ``;
    this does the same in one step for a string ``fromisoformat`` reads, and
    hands anything else to Django's. A claim converts four times per row: in
    a SQLite drain Django's took a twelfth of the loop.
    """
    if conn.vendor != "sqlite" or getattr(func, "__name__", "") != "convert_datetimefield_value":
        return func
    zone = conn.timezone if settings.USE_TZ else None
    parse = datetime.fromisoformat

    def convert(value: Any, expression: Any, connection: Any) -> Any:
        if type(value) is not str:
            return func(value, expression, connection)
        try:
            parsed = parse(value)
        except ValueError:
            return func(value, expression, connection)
        if zone is not None and parsed.tzinfo is None:
            return parsed.replace(tzinfo=zone)
        return parsed

    return convert


def take(
    table: Table, cursor: Any, intents: list[IntentRow], *, now: datetime, until: datetime
) -> list[Claimed]:
    """Claim these selected (and, where the database can, locked) intents by primary key.

    Each token is made in the statement from one salt, new for each claim, so
    a stale worker's token never matches, and is 128 random bits of hex (SPEC
    §2): where UPDATE returns rows (SQLite), an 8-byte salt and 8 random bytes
    drawn per row, returned; elsewhere (MariaDB) md5 of a 16-byte salt and the
    id's UTF-8 bytes, which this computes too, as PostgreSQL's claim does. Ids
    are any string, so a token is never cut from the id alone.
    """
    if not intents:
        return []
    salt = secrets.token_hex(8 if table.returning else 16)
    ids = [intent.id for intent in intents]
    table.execute(
        cursor, "claim_update", salt=salt, until=table.dt(until), now=table.dt(now), ids=ids
    )
    if table.returning:
        tokens = dict(cursor.fetchall())
    else:
        tokens = {id: hashlib.md5((salt + id).encode()).hexdigest() for id in ids}  # noqa: S324
    claimed: list[Claimed] = []
    for intent in intents:
        lease_end = intent.claim_until if intent.state == RUNNING else None
        intent.state = RUNNING
        intent.attempts += 1
        intent.claim_token = tokens[intent.id]
        intent.claim_until = until
        intent.updated_at = now
        claimed.append((intent, lease_end))
    return claimed
