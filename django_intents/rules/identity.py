"""An intent's identity: the validated ``(kind, event_id, target)`` triple and its hash.

A blank field (empty, or only whitespace) is refused: it is always a bug in
the caller (an unset form field, a template that rendered nothing), and two
such bugs would otherwise share one intent. Whitespace around a non-blank
value is kept as given, since the id hashes the stored value exactly and
trimming it would change the id of intents already enqueued.
"""

from __future__ import annotations

import hashlib
from typing import Any

# The column sizes are part of the public contract, so they live here and the
# model reads them from here.
MAX_LENGTHS = {"kind": 100, "event_id": 255, "target": 2048}
ID_LENGTH = 64


def check_text(name: str, value: Any, max_length: int | None = None, *, blank: bool = False) -> str:
    """Return ``value`` if it is a non-blank, NUL-free string that fits its column.

    ``blank=True`` lets whitespace-only values through (never an empty one),
    for opaque keys such as an id chosen by the caller.
    """
    limit = MAX_LENGTHS[name] if max_length is None else max_length
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if value.isspace() and not blank:
        raise ValueError(f"{name} must not be blank (only whitespace)")
    if len(value) > limit:
        raise ValueError(f"{name} is {len(value)} characters long; the limit is {limit}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode text (lone surrogate)") from exc
    return value


def intent_id(kind: str, event_id: str, target: str) -> str:
    """Return the deterministic id of an intent: its idempotency key."""
    return digest(
        check_text("kind", kind), check_text("event_id", event_id), check_text("target", target)
    )


def digest(kind: str, event_id: str, target: str) -> str:
    """``intent_id`` of a triple already checked by ``check_text``."""
    return hashlib.sha256(f"{kind}\x00{event_id}\x00{target}".encode()).hexdigest()


def check_id(value: Any) -> str:
    """An id as a caller gives it: any non-empty string, so every stored row stays reachable."""
    return check_text("id", value, ID_LENGTH, blank=True)
