"""The handler registry: decorator, discovery of ``handlers.py``, dotted paths, conflicts."""

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_intents.handlers import HandlerRegistry, discover
from tests.testapp import handlers as test_handlers

from .workerutil import ROOT


def first(intent, attempt):
    pass


def second(intent, attempt):
    pass


def test_decorator_registers_the_function_and_returns_it_unchanged():
    registry = HandlerRegistry()

    decorated = registry.handler("webhook")(first)

    assert decorated is first
    assert registry.resolve() == {"webhook": first}


def test_a_kind_registered_twice_is_an_error_naming_both_handlers():
    registry = HandlerRegistry()
    registry.handler("webhook")(first)

    with pytest.raises(ImproperlyConfigured) as caught:
        registry.handler("webhook")(second)

    message = str(caught.value)
    assert "'webhook'" in message
    assert f"{__name__}.first" in message
    assert f"{__name__}.second" in message
    assert registry.resolve() == {"webhook": first}


def test_the_same_function_registered_again_is_not_a_conflict():
    registry = HandlerRegistry()
    registry.handler("webhook")(first)
    registry.handler("webhook")(first)
    assert registry.resolve() == {"webhook": first}


@pytest.mark.parametrize("kind", ["", "x" * 101, "a\x00b", 7])
def test_decorator_refuses_an_invalid_kind(kind):
    with pytest.raises(ValueError, match="kind"):
        HandlerRegistry().handler(kind)


def test_discover_imports_every_apps_handlers_module_and_adds_dotted_paths():
    with override_settings(INTENTS={"HANDLERS": {"test.dotted": "tests.testapp.handlers.dotted"}}):
        found = discover()
    assert found["test.ok"] is test_handlers.ok
    assert found["test.sleepy"] is test_handlers.sleepy
    assert found["test.dotted"] is test_handlers.dotted


def test_dotted_path_for_a_decorated_kind_is_an_error_naming_both():
    with (
        override_settings(INTENTS={"HANDLERS": {"test.ok": "tests.testapp.handlers.dotted"}}),
        pytest.raises(ImproperlyConfigured) as caught,
    ):
        discover()
    message = str(caught.value)
    assert "'test.ok'" in message
    assert "tests.testapp.handlers.ok" in message
    assert "tests.testapp.handlers.dotted" in message


def test_dotted_path_naming_the_decorated_function_itself_is_not_a_conflict():
    with override_settings(INTENTS={"HANDLERS": {"test.ok": "tests.testapp.handlers.ok"}}):
        assert discover()["test.ok"] is test_handlers.ok


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.testapp.handlers.no_such_function", "cannot import"),
        ("no_such_module.handler", "cannot import"),
        ("tests.testapp.handlers.PATIENCE", "not callable"),
    ],
)
def test_a_bad_dotted_path_is_a_start_up_error_naming_it(path, message):
    with (
        override_settings(INTENTS={"HANDLERS": {"job": path}}),
        pytest.raises(ImproperlyConfigured, match=message) as caught,
    ):
        discover()
    assert path in str(caught.value)


def test_package_exports_handler_and_attempt_before_apps_are_ready():
    # A handlers.py starts with "from django_intents import handler": that import
    # must not touch models, or it fails before the app registry is ready.
    code = (
        "import sys, django_intents\n"
        "assert django_intents.handler is django_intents.handlers.handler\n"
        "assert django_intents.Attempt.__name__ == 'Attempt'\n"
        "assert 'django_intents.models' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
