"""The handler registry: which function runs each kind of intent.

Handlers come from two places: ``@handler(kind)`` in an installed app's
``handlers`` module (discovered like ``admin.py``) and dotted paths in
``INTENTS["HANDLERS"]``. A kind has exactly one handler; a second one is an
error naming both, never a silent override that would send work to the wrong
function. ``manage.py check`` and the worker start validate them alike
(:func:`problems`), so a broken path or a wrong signature is found before the
first intent of its kind is claimed.

Enqueue refuses a kind that nothing runs (a typo would otherwise wait forever):
:func:`check_kind` looks the kind up in :func:`known_kinds`, a frozenset built
once per process (the ``handlers`` modules are imported then, the dotted paths
are not) and rebuilt only when a handler is registered or settings change.
The same declared kinds bound the metrics' ``kind`` label (:func:`metric_kinds`),
cached and forgotten with it.

This module must stay importable before the app registry is ready, because
``django_intents.handler`` is used at the top of ``handlers.py`` modules.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules, import_string

from django_intents.conf import get_settings
from django_intents.rules.identity import check_text
from django_intents.rules.kinds import TASK_KIND

if TYPE_CHECKING:
    from django_intents.attempt import Attempt

# What the pool calls: ``handler(intent, attempt)``, the intent an ``Intent``.
# The type cannot name the model, whose manager asks this registry for kinds;
# ``Any`` takes a handler that annotates its intent as an ``Intent``.
Handler = Callable[[Any, "Attempt"], Any]
H = TypeVar("H", bound=Callable[..., Any])


def describe(func: Callable[..., Any]) -> str:
    """Return ``module.qualname``: how logs and error messages name a handler."""
    if isinstance(func, functools.partial):
        return f"functools.partial({describe(func.func)})"
    module = getattr(func, "__module__", None) or "?"
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{module}.{name}"


class HandlerRegistry:
    """Kind -> handler, filled by ``@handler(kind)`` as ``handlers`` modules are imported."""

    def __init__(self) -> None:
        self._registry: dict[str, Handler] = {}

    def register(self, kind: str, func: Handler) -> None:
        kind = check_text("kind", kind)
        if not callable(func):
            raise TypeError(f"the handler for kind {kind!r} must be callable, not {func!r}")
        current = self._registry.get(kind)
        # The same function imported again (a reload, a module imported under
        # the same name twice) is not a conflict; another function is.
        if current is not None and describe(current) != describe(func):
            raise ImproperlyConfigured(
                f"kind {kind!r} is registered twice: {describe(current)} and {describe(func)}"
            )
        self._registry[kind] = func
        # A handler registered after the first enqueue (a test, a late import)
        # makes its kind known, and labelled in metrics, from then on.
        forget_kinds()

    def handler(self, kind: str) -> Callable[[H], H]:
        """Decorator: register the function as the handler of ``kind``."""
        check_text("kind", kind)

        def decorator(func: H) -> H:
            self.register(kind, func)
            return func

        return decorator

    def kinds(self) -> frozenset[str]:
        return frozenset(self._registry)

    def resolve(self, paths: Mapping[str, str] | None = None) -> dict[str, Handler]:
        """Return the decorated handlers merged with ``paths`` (kind -> dotted path).

        Raises ``ImproperlyConfigured`` naming every problem :func:`problems` finds.
        """
        found, errors = self.collect(paths or {})
        if errors:
            raise ImproperlyConfigured("; ".join(str(error) for error in errors))
        return found

    def collect(self, paths: Mapping[str, str]) -> tuple[dict[str, Handler], list[HandlerProblem]]:
        """Import ``paths`` and return every handler found with every problem on the way."""
        found = dict(self._registry)
        errors = []
        for kind, path in paths.items():
            key = f"INTENTS['HANDLERS'][{kind!r}]"
            try:
                func = import_string(path)
            except ImportError as exc:
                errors.append(HandlerProblem(key, f"cannot import {path!r}: {exc}", IMPORT))
                continue
            if not callable(func):
                errors.append(HandlerProblem(key, f"{path!r} is not callable", NOT_CALLABLE))
                continue
            current = found.get(kind)
            if current is not None and current is not func:
                message = (
                    f"kind {kind!r} is registered twice: {describe(current)} (@handler) "
                    f"and {path} (INTENTS['HANDLERS'])"
                )
                errors.append(HandlerProblem(key, message, TWICE))
                continue
            found[kind] = func
        for kind, func in sorted(found.items()):
            problem = signature_problem(func)
            if problem is not None:
                errors.append(HandlerProblem(f"handler of kind {kind!r}", problem, SIGNATURE))
        return found, errors


# Stable system check ids of the handler problems (checks.py reports them).
IMPORT = "django_intents.E004"
NOT_CALLABLE = "django_intents.E005"
SIGNATURE = "django_intents.E006"
TWICE = "django_intents.E007"
HINTS = {
    IMPORT: "Check the dotted path: 'package.module.function', importable from this project.",
    NOT_CALLABLE: "Point the path at the handler function itself, not at its module.",
    SIGNATURE: "A handler is called as handler(intent, attempt): accept two arguments.",
    TWICE: "Keep one of the two: the @handler decorator or the INTENTS['HANDLERS'] entry.",
}


@dataclass(frozen=True)
class HandlerProblem:
    """One broken handler; ``check_id`` is its stable system check id."""

    obj: str
    message: str
    check_id: str

    def __str__(self) -> str:
        return f"{self.obj}: {self.message}"

    @property
    def hint(self) -> str:
        return HINTS[self.check_id]


def signature_problem(func: Callable[..., Any]) -> str | None:
    """Say why ``func`` cannot be called as ``func(intent, attempt)``, or return ``None``.

    A callable without a readable signature (some builtins and C extensions)
    is given the benefit of the doubt: only a signature that is known to
    refuse two positional arguments is an error.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None)
    except TypeError as exc:
        return f"{describe(func)}{signature} cannot be called as (intent, attempt): {exc}"
    return None


registry = HandlerRegistry()


def handler(kind: str) -> Callable[[H], H]:
    """Register the decorated function as the handler of ``kind``::

    @handler("webhook")
    def deliver_webhook(intent, attempt): ...
    """
    return registry.handler(kind)


def discover() -> dict[str, Handler]:
    """Import every installed app's ``handlers`` module and return kind -> handler.

    Raises ``ImproperlyConfigured`` when a kind has two handlers, a dotted path
    in ``INTENTS["HANDLERS"]`` does not import or is not callable, or a handler
    cannot take ``(intent, attempt)``.
    """
    autodiscover_modules("handlers")
    return registry.resolve(get_settings().handlers)


def problems() -> list[HandlerProblem]:
    """Every problem :func:`discover` would raise on, for ``manage.py check``."""
    try:
        autodiscover_modules("handlers")
    except ImproperlyConfigured as exc:  # two @handler functions for one kind
        return [HandlerProblem("@handler", str(exc), TWICE)]
    return registry.collect(get_settings().handlers)[1]


@functools.cache
def known_kinds() -> frozenset[str]:
    """The kinds enqueue accepts: handled in this project, or run by another service."""
    autodiscover_modules("handlers")
    settings = get_settings()
    return registry.kinds() | frozenset(settings.handlers) | settings.external_kinds


@functools.cache
def metric_kinds() -> frozenset[str]:
    """The kinds that keep their name in the metrics' ``kind`` label; others are ``other``.

    ``INTENTS["METRIC_KINDS"]`` when set; by default every kind the project
    declares (:func:`known_kinds`) and the django.tasks kind: a finite set,
    so a per-tenant or mistyped kind cannot multiply the series, while the
    project's own kinds are never hidden under ``other``.
    """
    configured = get_settings().metric_kinds
    if configured is not None:
        return frozenset(configured)
    return known_kinds() | {TASK_KIND}


def forget_kinds() -> None:
    """Drop the cached kind sets; they are rebuilt on their next use."""
    known_kinds.cache_clear()
    metric_kinds.cache_clear()


def check_kind(kind: str) -> None:
    """Refuse ``kind`` unless something runs it; a typo would otherwise wait forever."""
    if kind in known_kinds():
        return
    close = difflib.get_close_matches(kind, sorted(known_kinds()), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"unknown kind {kind!r}{guess}: no handler in this project runs it, so nothing "
        f"would ever run the intent. Register one with @handler({kind!r}) in an app's "
        f"handlers.py or in INTENTS['HANDLERS'], or, if another service runs this kind, "
        f"list it in INTENTS['EXTERNAL_KINDS']."
    )


def unhandled(due: Mapping[str, int]) -> dict[str, int]:
    """Of ``due`` (kind -> due intents), the kinds nothing runs: they would wait forever.

    Such intents got past enqueue before their kind was checked (an older
    release, a handler since removed, a raw insert); health checks and the
    worker start name them.
    """
    known = known_kinds()
    return {kind: n for kind, n in sorted(due.items()) if n and kind not in known}


def _forget_known_kinds(*, setting: str, **kwargs: Any) -> None:
    if setting in ("INTENTS", "INSTALLED_APPS"):
        forget_kinds()


setting_changed.connect(_forget_known_kinds, dispatch_uid="django_intents.handlers.known")
