"""What ``upgrade.ok`` does; registered by ``handlers.py`` in the previous release's
processes, and by ``INTENTS["HANDLERS"]`` in this release's worker."""

from typing import Any


def ok(intent: Any, attempt: Any) -> None:
    return None
