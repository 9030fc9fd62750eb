"""How long a partner asks to be left alone, read from its HTTP response headers.

A 429 or 503 says when to come back in ``Retry-After`` (RFC 9110 §10.2.3:
delay-seconds or an HTTP-date), and rate-limited APIs often in
``RateLimit-Reset`` or ``X-RateLimit-Reset`` instead (delay-seconds). A
handler passes the answer to ``Retry(after=...)``. The headers come from any
HTTP client, so they are read as whatever mapping the client gives (httpx's
``Headers``, aiohttp's ``CIMultiDictProxy``, requests' ``CaseInsensitiveDict``
or a plain ``dict``) with names compared case-insensitively, and a value that
does not parse is passed over, never raised: a partner's broken header must not
turn a snooze into a failure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from django_intents.rules.validation import aware

#: The headers read, in the order they are tried: the first that parses wins.
HEADERS = ("retry-after", "ratelimit-reset", "x-ratelimit-reset")
# delay-seconds is 1*DIGIT; a fraction is accepted, a sign or an exponent is not.
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def retry_after(
    headers: Any, default: float | None = None, *, now: datetime | None = None
) -> float | None:
    """The seconds to wait before calling again, from ``headers``; ``default`` when none says.

    ``Retry-After`` (seconds, or an HTTP-date counted from ``now``, which
    defaults to the current time), else ``RateLimit-Reset``, else
    ``X-RateLimit-Reset`` (seconds). Never negative: a date in the past is 0.
    """
    if default is not None and (
        isinstance(default, bool)
        or not isinstance(default, int | float)
        or not math.isfinite(default)
        or default < 0
    ):
        raise ValueError(f"default must be None or seconds >= 0, not {default!r}")
    at = datetime.now(UTC) if now is None else aware("now", now)
    found = _values(headers)
    for name in HEADERS:
        for value in found.get(name, ()):
            seconds = _seconds(value, at, dates=name == "retry-after")
            if seconds is not None:
                return seconds
    return default


def _values(headers: Any) -> dict[str, list[Any]]:
    """Every value of every header, by lower-cased name, in the order given.

    ``multi_items`` (httpx) and ``items`` of a multidict (aiohttp) give a
    repeated header once per value; requests joins them with commas.
    """
    if isinstance(headers, str | bytes) or not (
        hasattr(headers, "multi_items") or hasattr(headers, "items")
    ):
        raise TypeError(f"headers must be a mapping of header names, not {type(headers).__name__}")
    pairs: Iterable[tuple[Any, Any]] = (
        headers.multi_items() if hasattr(headers, "multi_items") else headers.items()
    )
    found: dict[str, list[Any]] = {}
    for name, value in pairs:
        key = name.decode("latin-1") if isinstance(name, bytes) else name
        if isinstance(key, str):
            found.setdefault(key.strip().lower(), []).append(value)
    return found


def _seconds(value: Any, now: datetime, *, dates: bool) -> float | None:
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    if not dates:
        return None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime-date and "-0000": HTTP-dates are GMT (RFC 9110 §5.6.7)
        when = when.replace(tzinfo=UTC)
    try:
        return max((when - now).total_seconds(), 0.0)
    except OverflowError:
        return None
