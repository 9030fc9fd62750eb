"""The migrations apply and reverse on every database; 0003 to 0009 do exactly what they say."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from django_intents.models import Intent, PausedKind

from .conftest import T0, rows_table

pytestmark = pytest.mark.django_db(transaction=True)


def index_names() -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, rows_table(connection))
    return {name for name, info in found.items() if info["index"] and not info["primary_key"]}


def test_reversing_0003_restores_the_dropped_indexes_and_reapplying_drops_them(vendor):
    latest = index_names()
    call_command("migrate", "django_intents", "0003", verbosity=0)
    try:
        after = index_names()
        call_command("migrate", "django_intents", "0002", verbosity=0)
        restored = index_names() - after
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    if vendor == "postgresql":
        assert len(restored) == 1 and restored.pop().endswith("_like")
    elif vendor == "mysql":
        assert restored == {"intents_claimable_idx", "intents_lease_idx", "intents_finished_idx"}
    else:
        assert restored == set()
    assert index_names() == latest


def test_0009_swaps_the_kind_index_for_one_with_event_ids_and_indexes_created_at():
    """Built CONCURRENTLY on PostgreSQL outside a transaction: check none is left invalid."""
    latest = index_names()
    assert {"intents_created_idx", "intents_kind_state_event_idx"} <= latest
    assert "intents_kind_state_idx" not in latest
    call_command("migrate", "django_intents", "0008", verbosity=0)
    try:
        reversed_to = index_names()
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    # 0015's index of ordered heads goes too, back past it.
    ordered = {
        "intents_ordered_mysql_idx" if connection.vendor == "mysql" else "intents_ordered_idx"
    }
    assert latest - reversed_to == {"intents_created_idx", "intents_kind_state_event_idx", *ordered}
    assert reversed_to - latest == {"intents_kind_state_idx"}
    assert index_names() == latest
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid")
            assert cursor.fetchone() == (0,)


def test_ids_kinds_and_tokens_compare_byte_for_byte_on_mysql(vendor):
    """Migration 0004: a binary NO PAD collation, whatever the database's default."""
    if vendor != "mysql":
        pytest.skip("PostgreSQL and SQLite compare text exactly without a migration")
    expected = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    assert collations() == dict.fromkeys(("id", "kind", "claim_token"), expected)
    call_command("migrate", "django_intents", "0003", verbosity=0)
    try:
        reversed_to = collations()
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    # tests/settings.py creates the test database with utf8mb4_bin.
    assert reversed_to == dict.fromkeys(("id", "kind", "claim_token"), "utf8mb4_bin")
    assert collations() == dict.fromkeys(("id", "kind", "claim_token"), expected)


def test_reversing_0005_drops_snoozes_and_reapplying_adds_it_at_0_for_existing_rows():
    """Migration 0005: ``snoozes``, 0 for rows written before it and by the previous release."""
    assert "snoozes" in columns()
    call_command("migrate", "django_intents", "0004", verbosity=0)
    try:
        reversed_to = columns()
        insert_as_the_previous_release("a" * 64)
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    assert "snoozes" not in reversed_to
    assert "snoozes" in columns()
    insert_as_the_previous_release("b" * 64)  # mid-deployment: the old code still enqueues
    rows = Intent.objects.order_by("id").values_list("attempts", "snoozes")
    assert list(rows) == [(3, 0), (3, 0)]


def insert_as_the_previous_release(id: str) -> None:  # noqa: A002
    """An intent inserted by code that does not name ``snoozes``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {connection.ops.quote_name(Intent._meta.db_table)} "
            "(id, kind, event_id, target, payload, state, attempts, next_at, created_at, "
            "updated_at, last_error, claim_token, claim_until) "
            "VALUES (%s, 'k', 'e', 't', NULL, 'pending', 3, %s, %s, %s, '', '', NULL)",
            [id, *[connection.ops.adapt_datetimefield_value(T0)] * 3],
        )


def columns() -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_table_description(cursor, Intent._meta.db_table)
    return {column.name.lower() for column in found}


def collations() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s "
            "AND column_name IN ('id', 'kind', 'claim_token')",
            [Intent._meta.db_table],
        )
        return {name.lower(): collation for name, collation in cursor.fetchall()}


def test_reversing_0006_drops_the_paused_kinds_and_reapplying_makes_an_exact_key(vendor):
    """Migration 0006: ``PausedKind``, keyed byte for byte on MySQL as ``kind`` is (0004)."""
    table = PausedKind._meta.db_table
    call_command("migrate", "django_intents", "0005", verbosity=0)
    try:
        reversed_to = connection.introspection.table_names()
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    assert table not in reversed_to
    assert table in connection.introspection.table_names()
    if vendor == "mysql":
        expected = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT collation_name FROM information_schema.columns "
                "WHERE table_schema = DATABASE() AND table_name = %s AND column_name = 'kind'",
                [table],
            )
            assert cursor.fetchone()[0] == expected


def test_reversing_0013_drops_written_off_and_reapplying_adds_it_at_0_for_existing_rows():
    """Migration 0013_redrive: ``written_off``, 0 for rows written before it and by the
    previous release, which does not name it and still enqueues mid-deployment."""
    assert "written_off" in columns()
    call_command("migrate", "django_intents", "0012", verbosity=0)
    try:
        reversed_to = columns()
        insert_as_the_previous_release("a" * 64)
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    assert "written_off" not in reversed_to
    insert_as_the_previous_release("b" * 64)
    rows = Intent.objects.order_by("id").values_list("attempts", "snoozes", "written_off")
    assert list(rows) == [(3, 0, 0), (3, 0, 0)]
