from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from django_intents.conf import Retention, get_settings
from django_intents.handlers import metric_kinds
from django_intents.rules.kinds import TASK_KIND


def intents_errors():
    return [m for m in run_checks() if m.id.startswith("django_intents.")]


def test_defaults_match_the_spec(settings, request):
    del settings.INTENTS
    # Deleting a setting sends no setting_changed: forget the suite's INTENTS by hand.
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    conf = get_settings()
    assert (conf.workers, conf.lease, conf.renew_interval, conf.poll_interval) == (4, 30, 10, 0.1)
    assert conf.max_attempts is None
    assert conf.handlers == {}
    assert conf.metric_kinds is None  # the declared kinds: handlers.metric_kinds()
    assert conf.external_kinds == frozenset()
    assert conf.retention is None
    assert intents_errors() == []


def test_valid_settings_are_read(settings):
    settings.INTENTS = {
        "HANDLERS": {"billing": "tests.testapp.handlers.dotted"},
        "EXTERNAL_KINDS": ["billing.invoice"],
        "WORKERS": 8,
        "CONCURRENCY": 500,
        "LEASE": 60,
        "RENEW": 5,
        "POLL_INTERVAL": 0.5,
        "MAX_ATTEMPTS": 10,
        "METRIC_KINDS": ["webhook"],
        "RETENTION": {"completed": {"compact": timedelta(days=7), "delete": timedelta(days=90)}},
    }
    conf = get_settings()
    assert (conf.workers, conf.lease, conf.renew_interval, conf.max_attempts) == (8, 60, 5, 10)
    assert conf.concurrency == 500
    assert conf.retention == {"completed": Retention(timedelta(days=7), timedelta(days=90))}
    assert conf.external_kinds == {"billing.invoice"}
    assert intents_errors() == []


def test_metric_kinds_none_means_the_kinds_the_project_declares(settings):
    settings.INTENTS = {"METRIC_KINDS": None, "EXTERNAL_KINDS": ["billing.invoice"]}
    assert get_settings().metric_kinds is None
    assert intents_errors() == []
    # EXTERNAL_KINDS, the @handler kinds of tests/testapp and the django.tasks kind.
    assert metric_kinds() >= {"billing.invoice", "test.ok", "test.fail", TASK_KIND}
    # "replication", of the old fixed list, is now declared nowhere (the suite's
    # EXTERNAL_KINDS are replaced above, and no handler runs it).
    assert "replication" not in metric_kinds()


def test_settings_cache_follows_override_settings(settings):
    settings.INTENTS = {"LEASE": 5}
    assert get_settings().lease == 5
    settings.INTENTS = {"LEASE": 6}
    assert get_settings().lease == 6


@pytest.mark.parametrize(
    ("intents", "key", "check_id"),
    [
        ({"LEASSE": 5}, "LEASSE", "django_intents.E002"),
        ({"LEASE": -1}, "LEASE", "django_intents.E001"),
        ({"LEASE": "30"}, "LEASE", "django_intents.E001"),
        ({"WORKERS": 0}, "WORKERS", "django_intents.E001"),
        ({"WORKERS": 2.5}, "WORKERS", "django_intents.E001"),
        ({"CONCURRENCY": 0}, "CONCURRENCY", "django_intents.E001"),
        ({"CONCURRENCY": True}, "CONCURRENCY", "django_intents.E001"),
        ({"RENEW": 40}, "RENEW", "django_intents.E001"),
        ({"POLL_INTERVAL": 0}, "POLL_INTERVAL", "django_intents.E001"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS", "django_intents.E001"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS", "django_intents.E001"),
        ({"HANDLERS": ["webhook"]}, "HANDLERS", "django_intents.E001"),
        ({"HANDLERS": {"webhook": "nodots"}}, "HANDLERS", "django_intents.E001"),
        ({"METRIC_KINDS": "webhook"}, "METRIC_KINDS", "django_intents.E001"),
        ({"EXTERNAL_KINDS": "billing"}, "EXTERNAL_KINDS", "django_intents.E001"),
        ({"EXTERNAL_KINDS": ["billing", ""]}, "EXTERNAL_KINDS", "django_intents.E001"),
        ({"EXTERNAL_KINDS": [7]}, "EXTERNAL_KINDS", "django_intents.E001"),
        ({"EXTERNAL_KINDS": ["x" * 101]}, "EXTERNAL_KINDS", "django_intents.E001"),
        ({"RETENTION": {"pending": {"delete": timedelta(1)}}}, "RETENTION", "django_intents.E001"),
        ({"RETENTION": {"completed": {"delete": 5}}}, "RETENTION", "django_intents.E001"),
        (
            {"RETENTION": {"completed": {"compact": timedelta(9), "delete": timedelta(1)}}},
            "RETENTION",
            "django_intents.E001",
        ),
        ("not a dict", "INTENTS", "django_intents.E003"),
    ],
)
def test_bad_settings_fail_the_system_check_naming_the_key(settings, intents, key, check_id):
    settings.INTENTS = intents
    errors = intents_errors()
    assert [e.id for e in errors] == [check_id]
    assert repr(key) in errors[0].msg or key in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match=key):
        get_settings()
