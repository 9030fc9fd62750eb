"""The handler registry: which function runs each kind of intent.

Handlers come from two places, resolved when a worker pool starts rather than
at import time, so a web process that only enqueues never imports them:
``@handler(kind)`` in an installed app's ``handlers`` module (discovered like
``admin.py``) and dotted paths in ``INTENTS["HANDLERS"]``. A kind has exactly
one handler; a second one is a start-up error naming both, never a silent
override that would send work to the wrong function.

This module must stay importable before the app registry is ready, because
``django_intents.handler`` is used at the top of ``handlers.py`` modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules, import_string

from .conf import get_settings
from .identity import check_text

if TYPE_CHECKING:
    from .attempt import Attempt
    from .models import Intent

Handler = Callable[["Intent", "Attempt"], Any]
H = TypeVar("H", bound=Callable[..., Any])


def describe(func: Callable[..., Any]) -> str:
    """Return ``module.qualname``: how logs and error messages name a handler."""
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

    def handler(self, kind: str) -> Callable[[H], H]:
        """Decorator: register the function as the handler of ``kind``."""
        check_text("kind", kind)

        def decorator(func: H) -> H:
            self.register(kind, func)
            return func

        return decorator

    def resolve(self, paths: dict[str, str] | None = None) -> dict[str, Handler]:
        """Return the decorated handlers merged with ``paths`` (kind -> dotted path)."""
        found = dict(self._registry)
        for kind, path in (paths or {}).items():
            try:
                func = import_string(path)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"INTENTS['HANDLERS'][{kind!r}]: cannot import {path!r}: {exc}"
                ) from exc
            if not callable(func):
                raise ImproperlyConfigured(
                    f"INTENTS['HANDLERS'][{kind!r}]: {path!r} is not callable"
                )
            current = found.get(kind)
            if current is not None and current is not func:
                raise ImproperlyConfigured(
                    f"kind {kind!r} is registered twice: {describe(current)} (@handler) "
                    f"and {path} (INTENTS['HANDLERS'])"
                )
            found[kind] = func
        return found


registry = HandlerRegistry()


def handler(kind: str) -> Callable[[H], H]:
    """Register the decorated function as the handler of ``kind``::

    @handler("webhook")
    def deliver_webhook(intent, attempt): ...
    """
    return registry.handler(kind)


def discover() -> dict[str, Handler]:
    """Import every installed app's ``handlers`` module and return kind -> handler.

    Raises ``ImproperlyConfigured`` when a kind has two handlers or a dotted
    path in ``INTENTS["HANDLERS"]`` does not import.
    """
    autodiscover_modules("handlers")
    return registry.resolve(dict(get_settings().handlers))
