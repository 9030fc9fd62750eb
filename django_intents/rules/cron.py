"""``INTENTS["SCHEDULES"]`` (SPEC §11): what a schedule is, and when its slots start.

Parsing and stepping through cron expressions is cronsim's job (why cronsim:
docs/operations.md, "Schedules"); this module only refuses what is not
standard five-field cron, and turns cronsim's local wall-clock times into
the strictly increasing UTC instants that slot ids are made of.

Daylight saving time follows cronsim, which follows Debian's cron. An
expression with a fixed minute and hour (``30 2 * * *``) steps through local
wall-clock time: a slot in the hour that does not exist when clocks go
forward starts at the first minute after the gap, and a slot in the hour
that happens twice when clocks go back starts at its first occurrence only.
An expression whose minute or hour is a wildcard (``*/5 * * * *``,
``0 * * * *``) steps through elapsed time: it has no slot in the skipped
hour and one in each pass of the repeated hour, so its slots stay evenly
spaced. Either way each slot is one UTC instant, and so one intent.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from django_intents.rules.identity import MAX_LENGTHS, check_text
from django_intents.rules.validation import check_json

CATCH_UP = ("latest", "all", "none")
KEYS = ("cron", "kind", "target", "payload", "tz", "catch_up")
REQUIRED = ("cron", "kind", "target")
PREFIX = "schedule:"
STAMP = "%Y-%m-%dT%H:%M:%SZ"
# The name sits inside the slot's event id, between the prefix and the stamp.
MAX_NAME = MAX_LENGTHS["event_id"] - len(PREFIX) - len(":2026-01-01T00:00:00Z")
FIELDS = ("minute", "hour", "day of month", "month", "day of week")
# Standard cron, field by field: numbers, *, ranges, steps and lists, and
# three-letter names in the month and weekday fields. cronsim also reads
# extensions (a seconds field, L, W, #) that other crons do not: refused here,
# so a schedule means the same thing to anyone who reads it.
_ATOM = r"(?:\*|\d+|[A-Za-z]{3})"
_FIELD = re.compile(rf"{_ATOM}(?:-{_ATOM})?(?:/\d+)?(?:,{_ATOM}(?:-{_ATOM})?(?:/\d+)?)*")


@dataclass(frozen=True)
class Schedule:
    """One entry of ``INTENTS["SCHEDULES"]``: every slot of ``cron`` is one intent."""

    name: str
    cron: str
    kind: str
    target: str
    payload: Any = field(default=None, hash=False, compare=False)
    tz: str = "UTC"
    catch_up: str = "latest"

    def event_id(self, slot: datetime) -> str:
        """The slot's event id: the same for every pool that enqueues it, so it exists once."""
        return f"{PREFIX}{self.name}:{slot.astimezone(UTC).strftime(STAMP)}"

    @property
    def prefix(self) -> str:
        """What the event ids of this schedule's slots start with."""
        return f"{PREFIX}{self.name}:"

    def slot_of(self, event_id: str) -> datetime | None:
        """The slot an event id of this schedule names; ``None`` for any other event id."""
        if not event_id.startswith(self.prefix):
            return None
        try:
            return datetime.strptime(event_id[len(self.prefix) :], STAMP).replace(tzinfo=UTC)
        except ValueError:
            return None

    def after(self, moment: datetime) -> datetime | None:
        """The first slot that starts after ``moment``; ``None`` if there is none for 50 years."""
        for slot in self._forward(moment):
            if slot > moment:
                return slot
        return None

    def latest(self, moment: datetime) -> datetime | None:
        """The last slot that starts at or before ``moment``; ``None`` if there is none."""
        seek = moment.replace(microsecond=0) + timedelta(seconds=1)
        # Going back in wall-clock time can step over a slot of the first pass
        # of a repeated hour; going forward from a slot before it cannot.
        start = next((s for s in self._backward(seek) if s <= moment), None)
        if start is None:
            return None
        found = start
        while (step := self.after(found)) is not None and step <= moment:
            found = step
        return found

    def before(self, slot: datetime, count: int) -> tuple[datetime, ...]:
        """Up to ``count`` slots before ``slot`` (a slot of this schedule), oldest first."""
        return _before(self.cron, self.tz, slot, count)

    def _forward(self, moment: datetime) -> Iterator[datetime]:
        start = moment.astimezone(ZoneInfo(self.tz))
        return (slot.astimezone(UTC) for slot in CronSim(self.cron, start))

    def _backward(self, moment: datetime) -> Iterator[datetime]:
        start = moment.astimezone(ZoneInfo(self.tz))
        return (slot.astimezone(UTC) for slot in CronSim(self.cron, start, reverse=True))


@functools.lru_cache(maxsize=256)
def _before(cron: str, tz: str, slot: datetime, count: int) -> tuple[datetime, ...]:
    """Cached: a pool asks for the same catch-up window every second until the next slot."""
    found: list[datetime] = []
    if count < 1:
        return ()
    for earlier in CronSim(cron, slot.astimezone(ZoneInfo(tz)), reverse=True):
        earlier = earlier.astimezone(UTC)
        if earlier < (found[-1] if found else slot):
            found.append(earlier)
        if len(found) >= count:
            break
    return tuple(reversed(found))


def parse(value: Any) -> dict[str, Schedule]:
    """``INTENTS["SCHEDULES"]`` checked; raises ``ValueError`` naming what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a dict of name -> {{'cron': ..., 'kind': ...}}, not {value!r}")
    return {name: _schedule(name, entry) for name, entry in value.items()}


def _schedule(name: Any, entry: Any) -> Schedule:
    try:
        check_text("event_id", name, MAX_NAME)
    except ValueError as exc:
        reason = str(exc).replace("event_id", "the name")
        raise ValueError(f"has a bad name {name!r}: {reason}") from None
    if ":" in name:
        raise ValueError(f"has a bad name {name!r}: ':' separates the name in slot event ids")
    if not isinstance(entry, Mapping):
        raise ValueError(f"[{name!r}] must be a dict with 'cron', 'kind' and 'target'")
    unknown = sorted(str(key) for key in entry if key not in KEYS)
    if unknown:
        raise ValueError(f"[{name!r}] has unknown key(s) {', '.join(unknown)}; known: {KEYS}")
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"[{name!r}] is missing {', '.join(missing)}")
    try:
        schedule = Schedule(
            name=name,
            cron=check_cron(entry["cron"]),
            kind=check_text("kind", entry["kind"]),
            target=check_text("target", entry["target"]),
            payload=check_json(entry.get("payload"), "payload"),
            tz=check_tz(entry.get("tz", "UTC")),
            catch_up=check_catch_up(entry.get("catch_up", "latest")),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"[{name!r}]: {exc}") from None
    if schedule.after(datetime.now(UTC)) is None:
        raise ValueError(f"[{name!r}]: cron {schedule.cron!r} has no slot in the next 50 years")
    return schedule


def check_cron(value: Any) -> str:
    """A standard five-field cron expression, as cronsim reads it."""
    if not isinstance(value, str):
        raise ValueError(f"cron must be a string, not {type(value).__name__}")
    fields = value.split()
    if len(fields) != len(FIELDS):
        raise ValueError(
            f"cron {value!r} has {len(fields)} field(s); standard cron has five: "
            f"{', '.join(FIELDS)}"
        )
    for name, text in zip(FIELDS, fields, strict=True):
        if not _FIELD.fullmatch(text):
            raise ValueError(f"cron {value!r}: the {name} field {text!r} is not standard cron")
    try:
        CronSim(value, datetime.now(UTC))
    except CronSimError as exc:
        raise ValueError(f"cron {value!r}: {str(exc).lower()} field") from None
    return " ".join(fields)


def check_tz(value: Any) -> str:
    """A zoneinfo name (``"Europe/Paris"``) this Python knows."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"tz must be a zoneinfo name such as 'Europe/Paris', not {value!r}")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"tz {value!r} is not a time zone zoneinfo knows") from None
    return value


def check_catch_up(value: Any) -> str:
    if value not in CATCH_UP:
        raise ValueError(f"catch_up must be one of {', '.join(CATCH_UP)}, not {value!r}")
    return str(value)
