"""PostgreSQL's cursors: parameters bound by the server, timestamps loaded in C, pipelines."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.backends.postgresql.psycopg_any import is_psycopg3

if is_psycopg3:
    from django.db.backends.postgresql.base import ServerBindingCursor
    from psycopg import Pipeline, postgres, pq

    # psycopg's fastest text loader for timestamptz (C, with psycopg[binary]).
    TIMESTAMPTZ_LOADER: Any = postgres.adapters.get_loader(
        postgres.types["timestamptz"].oid, pq.Format.TEXT
    )
else:
    TIMESTAMPTZ_LOADER = None


def server_cursor(alias: str) -> Any:
    """A cursor whose parameters the server binds, on psycopg 3.

    Django binds parameters on the client by default, so every statement is
    new text that the server parses and plans again, and psycopg spends more
    time composing it than sending it. These statements are written to be
    bound by the server (a placeholder only where a value goes), which made a single
    ``enqueue`` about a third faster (docs/benchmarks.md). Nothing is
    prepared unless ``OPTIONS["prepare_threshold"]`` says so, so connection
    poolers keep working. The cursor is wrapped like Django's own, so query
    logging and ``execute_wrapper`` see every statement.
    """
    connection = connections[alias]
    if not is_psycopg3:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        # django-stubs type Django's cursor classes, not psycopg's subclass of them.
        raw: Any = ServerBindingCursor(connection.connection)  # type: ignore[call-arg]
    if fast_timestamps(connection):
        raw.adapters.register_loader("timestamptz", TIMESTAMPTZ_LOADER)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def fast_timestamps(connection: Any) -> bool:
    """Whether psycopg's own C loader returns exactly what Django's would.

    Django loads ``timestamptz`` with a Python subclass of psycopg's loader
    that only replaces ``tzinfo`` with the connection's time zone; with
    ``USE_TZ`` and a UTC session that is what the C loader returns anyway,
    seven times faster: a claim of 500 intents parses 2,000 timestamps.
    """
    return bool(
        TIMESTAMPTZ_LOADER is not None and settings.USE_TZ and connection.timezone_name == "UTC"
    )


@contextlib.contextmanager
def one_round_trip(alias: str) -> Iterator[None]:
    """Run the statements issued inside as one transaction, sent in one round trip.

    A limited claim is two statements (the kinds' advisory locks, the
    claim) whose results only matter together. In autocommit, the
    statements of a pipeline up to its Sync run as one implicit
    transaction (PostgreSQL's extended query protocol), so no ``BEGIN``
    or ``COMMIT`` is sent: the Sync at the pipeline's exit commits, and
    releases the locks, as soon as the last statement ends, without a
    round trip to the client in between. Read the results after the
    block. Inside an atomic block, or without pipeline mode (psycopg 2),
    the statements run in a write transaction as usual.
    """
    connection = connections[alias]
    if (
        is_psycopg3
        and Pipeline.is_supported()
        and connection.get_autocommit()
        and not connection.in_atomic_block
    ):
        with connection.wrap_database_errors, connection.connection.pipeline():
            yield
    else:
        with transaction.atomic(using=alias):
            yield
