"""Enqueue refuses a kind that nothing runs: a typo fails where it is made.

A kind is known when a handler of this project runs it (``@handler`` in an
app's ``handlers.py``, a key of ``INTENTS["HANDLERS"]``, the django.tasks kind)
or when ``INTENTS["EXTERNAL_KINDS"]`` says another service runs it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_intents import handlers
from django_intents.handlers import forget_kinds, known_kinds, registry
from django_intents.models import Intent
from django_intents.rules.kinds import TASK_KIND

from .conftest import T0, enqueue, intents, snapshot

pytestmark = pytest.mark.django_db


def test_a_typo_of_a_known_kind_is_refused_naming_it_and_the_fix():
    enqueue(2)
    before = snapshot()
    with pytest.raises(ValueError) as caught:
        Intent.objects.enqueue("webhok", "e", "t", now=T0)
    message = str(caught.value)
    assert "unknown kind 'webhok' (did you mean 'webhook'?)" in message
    assert "@handler('webhok')" in message
    assert "INTENTS['HANDLERS']" in message
    assert "INTENTS['EXTERNAL_KINDS']" in message
    assert snapshot() == before


def test_a_kind_like_nothing_known_is_refused_without_a_guess():
    before = snapshot()
    with pytest.raises(ValueError, match="unknown kind 'zzzzzz': no handler") as caught:
        Intent.objects.enqueue("zzzzzz", "e", "t", now=T0)
    assert "did you mean" not in str(caught.value)
    assert snapshot() == before


def test_enqueue_many_refuses_the_whole_batch_for_one_unknown_kind():
    enqueue(1)
    before = snapshot()
    items = [
        {"kind": "webhook", "event_id": "a", "target": "t"},
        {"kind": "jbo", "event_id": "b", "target": "t"},
        {"kind": "push", "event_id": "c", "target": "t"},
    ]
    with pytest.raises(ValueError, match="unknown kind 'jbo'"):
        Intent.objects.enqueue_many(items, now=T0)
    assert snapshot() == before


def test_a_refusal_inside_a_transaction_leaves_the_transaction_usable():
    with transaction.atomic():
        first = Intent.objects.enqueue("webhook", "a", "t", now=T0)
        with pytest.raises(ValueError, match="unknown kind"):
            Intent.objects.enqueue("webhok", "b", "t", now=T0)
        second = Intent.objects.enqueue("push", "c", "t", now=T0)
    assert sorted(row[0] for row in snapshot()) == sorted([first, second])


def test_an_invalid_kind_is_still_refused_as_invalid_before_it_is_looked_up():
    with pytest.raises(ValueError, match="kind must not be empty"):
        Intent.objects.enqueue("", "e", "t", now=T0)


@pytest.mark.parametrize(
    "kind",
    [
        "test.ok",  # @handler in tests/testapp/handlers.py
        "webhook",  # INTENTS["EXTERNAL_KINDS"] of tests/settings.py
        TASK_KIND,  # TASKS names django_intents' backend
    ],
)
def test_kinds_with_a_handler_or_declared_external_are_accepted(kind):
    id = Intent.objects.enqueue(kind, "e", "t", now=T0)
    assert Intent.objects.get(pk=id).kind == kind


def test_a_key_of_the_handlers_setting_is_known_without_importing_its_path():
    # Enqueue only reads the keys; `manage.py check` and the worker import the paths.
    with override_settings(INTENTS=intents(HANDLERS={"billing": "billing.not_imported.run"})):
        id = Intent.objects.enqueue("billing", "e", "t", now=T0)
    assert Intent.objects.get(pk=id).kind == "billing"


def test_override_settings_declares_and_forgets_an_external_kind():
    with override_settings(INTENTS=intents(EXTERNAL_KINDS=["billing.invoice"])):
        Intent.objects.enqueue("billing.invoice", "e", "t", now=T0)
    before = snapshot()
    with pytest.raises(ValueError, match="unknown kind 'billing.invoice'"):
        Intent.objects.enqueue("billing.invoice", "f", "t", now=T0)
    assert snapshot() == before


def test_a_handler_registered_after_the_first_enqueue_makes_its_kind_known(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    enqueue(1)
    with pytest.raises(ValueError, match="unknown kind 'late'"):
        Intent.objects.enqueue("late", "e", "t", now=T0)

    registry.register("late", lambda intent, attempt: None)
    Intent.objects.enqueue("late", "e", "t", now=T0)
    monkeypatch.undo()
    forget_kinds()


def test_discovery_runs_once_and_enqueue_reads_a_cached_set(monkeypatch):
    forget_kinds()
    calls: list[Any] = []
    real = handlers.autodiscover_modules
    monkeypatch.setattr(handlers, "autodiscover_modules", lambda *a: calls.append(a) or real(*a))
    enqueue(3)
    Intent.objects.enqueue_many([{"kind": "job", "event_id": "x", "target": "t"}], now=T0)
    assert calls == [("handlers",)]
    assert isinstance(known_kinds(), frozenset)
