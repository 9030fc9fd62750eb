"""Handlers with the mistakes ``manage.py check`` and the worker start must catch.

Not named ``handlers.py``: nothing discovers this module; tests name its
functions in ``INTENTS["HANDLERS"]``.
"""

from __future__ import annotations

import functools
from typing import Any

NOT_A_FUNCTION = 42


def one_argument(intent: Any) -> None:
    """Forgot the attempt."""


def needs_a_keyword(intent: Any, attempt: Any, *, retries: int) -> None:
    """Wants an argument the worker never passes."""


def three_arguments(client: Any, intent: Any, attempt: Any) -> None:
    """Taken whole it is wrong; bound with ``functools.partial`` it is right."""


bound = functools.partial(three_arguments, None)


class Deliverer:
    """An instance with ``__call__(intent, attempt)`` is a handler too."""

    def __call__(self, intent: Any, attempt: Any) -> None:
        pass


deliver = Deliverer()
