"""``manage.py check`` and the worker start import every handler and refuse broken ones."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_intents.handlers import discover, signature_problem
from tests.testapp import broken

from .conftest import intents


def errors(handlers: dict[str, str]) -> list[Any]:
    with override_settings(INTENTS=intents(HANDLERS=handlers)):
        return [m for m in run_checks() if m.id.startswith("django_intents.")]


def test_the_suites_handlers_pass_the_check():
    assert [m for m in run_checks() if m.id.startswith("django_intents.")] == []


@pytest.mark.parametrize(
    ("path", "check_id", "says"),
    [
        ("tests.testapp.broken.no_such_function", "django_intents.E004", "cannot import"),
        ("no_such_module.handler", "django_intents.E004", "No module named 'no_such_module'"),
        ("tests.testapp.broken.NOT_A_FUNCTION", "django_intents.E005", "is not callable"),
        ("tests.testapp.broken.one_argument", "django_intents.E006", "(intent, attempt)"),
        ("tests.testapp.broken.needs_a_keyword", "django_intents.E006", "retries"),
        ("tests.testapp.broken.three_arguments", "django_intents.E006", "attempt"),
        ("tests.testapp.handlers.dotted", "django_intents.E007", "registered twice"),
    ],
)
def test_a_broken_handler_fails_the_check_naming_its_key(path, check_id, says):
    kind = "test.ok" if check_id == "django_intents.E007" else "billing"
    [error] = errors({kind: path})
    assert error.id == check_id
    assert says in error.msg
    assert repr(kind) in error.obj
    assert error.hint


def test_every_broken_handler_is_reported_at_once():
    found = errors(
        {"a": "tests.testapp.broken.one_argument", "b": "tests.testapp.broken.NOT_A_FUNCTION"}
    )
    assert sorted(e.id for e in found) == ["django_intents.E005", "django_intents.E006"]


def test_the_worker_start_refuses_what_the_check_refuses():
    handlers = {"billing": "tests.testapp.broken.one_argument"}
    with override_settings(INTENTS=intents(HANDLERS=handlers)):
        with pytest.raises(ImproperlyConfigured, match="cannot be called as .intent, attempt."):
            discover()
        with pytest.raises(CommandError, match="handler of kind 'billing'"):
            call_command("run_intent_workers", "--drain")


def test_a_bad_setting_is_reported_once_not_as_a_handler_problem():
    with override_settings(INTENTS={"HANDLERS": ["not", "a", "dict"]}):
        found = [m for m in run_checks() if m.id.startswith("django_intents.")]
    assert [e.id for e in found] == ["django_intents.E001"]


def two(intent: Any, attempt: Any) -> None:
    pass


def flexible(*args: Any, **kwargs: Any) -> None:
    pass


def defaults(intent: Any, attempt: Any = None, extra: int = 0) -> None:
    pass


@pytest.mark.parametrize(
    "func",
    [two, flexible, defaults, broken.bound, broken.deliver, print, functools.partial(max)],
    ids=["function", "varargs", "defaults", "partial", "callable-object", "builtin", "builtin-p"],
)
def test_callables_that_take_intent_and_attempt_pass(func):
    assert signature_problem(func) is None


@pytest.mark.parametrize(
    "func",
    [
        broken.one_argument,
        broken.needs_a_keyword,
        broken.three_arguments,
        functools.partial(two, None),
        lambda: None,
    ],
    ids=["one-argument", "keyword-only", "three", "over-bound-partial", "no-argument"],
)
def test_callables_that_cannot_take_intent_and_attempt_are_named(func):
    problem = signature_problem(func)
    assert problem is not None
    assert "cannot be called as (intent, attempt)" in problem
