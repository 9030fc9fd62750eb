"""The migrations apply and reverse on every database; 0003 drops exactly what it says."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from django_intents.models import Intent

pytestmark = pytest.mark.django_db(transaction=True)


def index_names() -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, Intent._meta.db_table)
    return {name for name, info in found.items() if info["index"] and not info["primary_key"]}


def test_reversing_0003_restores_the_dropped_indexes_and_reapplying_drops_them(vendor):
    after = index_names()
    call_command("migrate", "django_intents", "0002", verbosity=0)
    try:
        restored = index_names() - after
    finally:
        call_command("migrate", "django_intents", verbosity=0)
    if vendor == "postgresql":
        assert len(restored) == 1 and restored.pop().endswith("_like")
    elif vendor == "mysql":
        assert restored == {"intents_claimable_idx", "intents_lease_idx", "intents_finished_idx"}
    else:
        assert restored == set()
    assert index_names() == after
