"""Issue 40: ``migrate`` and ``check --database`` print no ``models.W037`` on a supported database.

W037 ("does not support indexes with conditions") is only emitted when the
checks are given a database, as ``migrate`` and ``check --database`` do; the
tests below do the same on the database the suite runs on.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections, models
from django.db.models import Q
from django.test.utils import isolate_apps

from django_intents.models import Intent


def ids(messages: list) -> list[str]:
    return [message.id for message in messages]


@pytest.mark.django_db
def test_the_intent_model_passes_its_checks_on_this_database():
    # The partial indexes' conditions are dropped on MySQL and MariaDB, where
    # migrations 0002 and 0007 add full indexes instead: nothing to warn about.
    assert ids(Intent.check(databases=list(connections))) == []


@pytest.mark.django_db
def test_no_check_of_the_project_reports_w037_on_this_database():
    assert "models.W037" not in ids(run_checks(databases=list(connections)))


@pytest.mark.django_db
def test_check_with_database_prints_no_w037():
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    assert "W037" not in out.getvalue() + err.getvalue()
    assert "System check identified no issues" in out.getvalue()


@pytest.mark.django_db
def test_migrate_prints_no_w037():
    """As the issue found it: ``migrate`` runs the checks with its database first."""
    out, err = StringIO(), StringIO()
    call_command("migrate", "--database", "default", skip_checks=False, stdout=out, stderr=err)
    assert "W037" not in out.getvalue() + err.getvalue()
    assert "No migrations to apply" in out.getvalue()


@pytest.mark.django_db
@isolate_apps("tests.testapp")
def test_another_models_conditional_index_still_gets_w037_where_conditions_are_ignored():
    """The warning is dropped for Intent only, not silenced for every model."""

    class Flagged(models.Model):
        done = models.BooleanField()

        class Meta:
            app_label = "testapp"
            indexes = (models.Index(fields=("done",), condition=Q(done=False), name="open_idx"),)

    expected = [] if connection.features.supports_partial_indexes else ["models.W037"]
    assert ids(Flagged.check(databases=["default"])) == expected
