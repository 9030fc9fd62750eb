"""Arguments checked before anything is written, and values made storable.

Every public method refuses bad input with a ``TypeError`` or ``ValueError``
naming the argument, before it touches the database: a refused call writes
nothing. Identity fields (kind, event id, target, id) are checked in
``identity.py``; this module holds the rest.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from django_intents.rules.identity import check_id, check_text, digest
from django_intents.rules.states import NO_CLAIM, State

MAX_ERROR_LENGTH = 10_000
MAX_TRACEBACK_LENGTH = 8192  # characters: the tail of a failure's traceback
ITEM_KEYS = frozenset({"kind", "event_id", "target", "payload", "next_at", "id", "priority"})
PRIORITY_RANGE = (-100, 100)


def aware(name: str, value: Any) -> datetime:
    """``value`` if it is an aware datetime that converts to UTC."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if timezone.is_naive(value):
        raise ValueError(f"{name} must be an aware datetime (USE_TZ), not naive {value}")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{name} {value} is outside the calendar once converted to UTC") from None
    return value


def check_priority(value: Any) -> int:
    """An intent's priority: an ``int`` in ``PRIORITY_RANGE``; ``None`` is the default 0.

    A ``bool`` is refused although it is an ``int``: ``priority=True`` is a
    mistake, not a request for priority 1.
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int, not {type(value).__name__}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise ValueError(f"priority must be between {low} and {high}, not {value}")
    return int(value)


def later(now: datetime, delta: timedelta, name: str) -> datetime:
    """``now + delta``, refused with ``name`` when it leaves the calendar."""
    try:
        return now + delta
    except OverflowError:
        raise ValueError(f"{name} {delta} from {now} ends after the year 9999") from None


def lease(value: Any, default: float) -> timedelta:
    """A lease given as seconds or a ``timedelta``; ``default`` seconds when ``None``."""
    if value is None:
        return timedelta(seconds=default)
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = value
    else:
        raise TypeError(f"lease must be seconds or a timedelta, not {type(value).__name__}")
    if not 0 < seconds < math.inf:
        raise ValueError(f"lease must be a positive duration, not {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"lease must be shorter than {timedelta.max}, not {value!r}") from None


def kinds(value: Iterable[str] | None) -> list[str] | None:
    """The kinds a claim may take, sorted and without repeats; ``None`` means every kind."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        raise TypeError("kinds must be a collection of kind names, not a single string")
    return sorted({check_text("kind", kind) for kind in value})


def token(value: Any) -> str:
    """A claim token as a caller passed it back: any storable string."""
    if not isinstance(value, str):
        raise TypeError(f"claim_token must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError("claim_token must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("claim_token is not valid Unicode text (lone surrogate)") from None
    return value


def claims(value: Any, name: str, most: int | None = None) -> list[tuple[str, str]]:
    """``(id, claim_token)`` pairs, each checked, each once; at most ``most`` of them."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} must be an iterable of (id, claim_token) pairs")
    pairs = list(dict.fromkeys((check_id(id), token(t)) for id, t in value))
    if most is not None and len(pairs) > most:
        raise ValueError(f"{name} takes at most {most} pairs, not {len(pairs)}")
    return pairs


def check_json(value: Any, path: str) -> Any:
    """Refuse what would not read back exactly: only JSON's own types are stored."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path} is {value!r}, which JSON cannot represent")
        return value
    if isinstance(value, str):
        return check_json_text(value, path)
    if isinstance(value, list):
        return [check_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{path} has key {key!r}; JSON object keys must be strings")
            check_json_text(key, f"{path} key")
        return {key: check_json(item, f"{path}[{key!r}]") for key, item in value.items()}
    raise TypeError(f"{path} is a {type(value).__name__}, which is not a JSON value")


def check_json_text(value: str, path: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{path} contains a NUL character, which databases refuse in JSON")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path} contains a lone surrogate and is not valid Unicode") from None
    return value


def error_text(cause: object) -> str:
    """``str(cause)``, made storable: no NUL, no lone surrogates, bounded length."""
    if cause is None:
        return ""
    text = str(cause).replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def traceback_text(cause: BaseException | str) -> str:
    """The tail of ``cause``'s traceback, made storable: what ``last_traceback`` keeps.

    The tail, because the frame that raised and the exception come last; the
    head of a deep stack is the framework the handler ran in.
    """
    if isinstance(cause, BaseException):
        cause = "".join(traceback.format_exception(cause))
    text = cause.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_TRACEBACK_LENGTH else "…" + text[1 - MAX_TRACEBACK_LENGTH :]


def exception_text(exc: BaseException) -> str:
    """``Type: message``: what ``last_error`` keeps of a handler's exception."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def new_row(
    kind: Any,
    event_id: Any,
    target: Any,
    payload: Any,
    next_at: Any,
    id: Any,  # noqa: A002
    now: datetime | None,
    label: str = "",
    priority: Any = None,
) -> dict[str, Any]:
    """A new intent's row, every value checked; errors are prefixed with ``label``.

    With ``now=None`` the row has no time yet: the manager routes it first
    (its database decides), then gives it that database's time (``stamp``).
    """
    try:
        kind, event_id, target = (
            check_text("kind", kind),
            check_text("event_id", event_id),
            check_text("target", target),
        )
        return {
            "id": digest(kind, event_id, target) if id is None else check_id(id),
            "kind": kind,
            "event_id": event_id,
            "target": target,
            "payload": check_json(payload, "payload"),
            "state": State.PENDING.value,
            "attempts": 0,
            "snoozes": 0,
            "written_off": 0,
            "priority": check_priority(priority),
            "next_at": now if next_at is None else aware("next_at", next_at),
            "created_at": now,
            "updated_at": now,
            "last_error": "",
            "last_traceback": "",
            **NO_CLAIM,
            "trace_context": "",
        }
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{label}{exc}") from None


def stamp(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``row``, built with ``now=None``, given the time ``now`` (of the database it goes to)."""
    row["created_at"] = row["updated_at"] = now
    if row["next_at"] is None:
        row["next_at"] = now
    return row


def item_row(index: int, item: Any, now: datetime | None) -> dict[str, Any]:
    """One ``enqueue_many`` item as a row; errors name the item."""
    label = f"items[{index}]: "
    if not isinstance(item, Mapping):
        raise TypeError(f"{label}must be a dict, not {type(item).__name__}")
    unknown = set(item) - ITEM_KEYS
    if unknown:
        raise ValueError(f"{label}unknown keys {sorted(map(str, unknown))}")
    missing = [key for key in ("kind", "event_id", "target") if key not in item]
    if missing:
        raise ValueError(f"{label}missing {', '.join(missing)}")
    return new_row(
        item["kind"],
        item["event_id"],
        item["target"],
        item.get("payload"),
        item.get("next_at"),
        item.get("id"),
        now,
        label=label,
        priority=item.get("priority"),
    )


def check_pool(
    handlers: Mapping[str, object], workers: int, concurrency: int, *, lease: float, renew: float
) -> None:
    """A worker pool's sizes; raises ``ValueError`` naming what is wrong."""
    if not handlers:
        raise ValueError("a worker pool needs at least one handler")
    for name, value in (("workers", workers), ("concurrency", concurrency)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    if not 0 < renew < lease:
        raise ValueError(f"renew ({renew} s) must be shorter than lease ({lease} s)")
