"""Target health (SPEC §14): how a kind treats each of its targets, and the arithmetic of it.

``LIMITS[kind]`` may give a kind a ``rate`` (at most N attempts of one target
start in any window of K seconds), a ``breaker`` (stop sending to a target
after F consecutive failures, probe it after a cooldown that doubles up to a
maximum) and ``ordered`` (a target's intents start one at a time, oldest
first). ``parse_policy`` checks those keys and builds a ``TargetPolicy``;
``rules/limits.parse`` calls it beside the caps and the timeout.

Everything here is pure: times come in as ``now`` (seconds or datetimes the
caller chose), so the window and the breaker are tested without a clock.
The state a hold or a breaker needs lives in the database (``TargetState``,
one row per target that is not plainly healthy), shared by every pool.

A hold (a 429's ``Retry-After``) also teaches its target a pace: without
one, every slot of every pool would send again the moment the hold ends and
the partner would refuse all but its rate of them. ``learned_pace`` says how
many starts the target may have per window after a hold, from the
successes the hold's window saw, until ``paced_until``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

POLICY_KEYS = ("rate", "breaker", "ordered")
BREAKER_KEYS = ("failures", "cooldown", "max_cooldown")
DEFAULT_COOLDOWN = 30.0
DEFAULT_MAX_COOLDOWN = 3600.0


class TargetHealth(StrEnum):
    """The states of a target in ``TargetState``; ``closed`` is healthy (with failures counted)."""

    CLOSED = "closed"  # healthy; ``failures`` may count consecutive failed attempts
    HELD = "held"  # held until ``until`` (a 429's Retry-After, or by hand)
    OPEN = "open"  # the breaker tripped: nothing is claimed until ``until``
    HALF_OPEN = "half_open"  # one probe is out; its result closes or reopens the breaker


# The states in which no intent of the target is claimed while ``until`` lies ahead.
BLOCKING = (TargetHealth.HELD, TargetHealth.OPEN)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
# A start is counted when it is claimed; its request reaches the partner a few
# milliseconds later, by an amount that varies with the load of the pool's
# host. A partner whose window sees a late start of one window and an early
# one of the next counts one too many. So a configured rate counts each start
# for its window and a tenth more, at most a second more: the partner's window
# never holds more than N, at the cost of that much of the rate
# (docs/benchmarks.md, "With target health", has the measure).
MARGIN_SHARE, MARGIN_MAX = 0.1, 1.0
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smh])\s*$")
# A learned pace (``learned_pace``): its window is the hold's length, at least
# PACE_MIN_WINDOW (a Retry-After of 0 or a fraction of a second says little of a
# partner's window) and at most PACE_MAX_WINDOW; it lasts PACE_MEMORY_WINDOWS of
# its windows after the hold, and at least PACE_MEMORY seconds: long enough that
# a partner is not sent a burst every few seconds, short enough that a partner
# that raised its rate is not kept slow for long.
PACE_MIN_WINDOW, PACE_MAX_WINDOW = 1.0, 3600.0
PACE_MEMORY, PACE_MEMORY_WINDOWS = 60.0, 10


@dataclass(frozen=True)
class Rate:
    """At most ``count`` attempts of one (kind, target) start in any window of ``seconds``;
    each start is counted for ``span``, the window and its ``margin`` (``parse_rate``)."""

    count: int
    seconds: float
    margin: float = 0.0

    @property
    def span(self) -> float:
        """How long a start counts: a window of ``span`` holding at most ``count`` starts
        keeps every window of ``seconds`` within the rate too."""
        return self.seconds + self.margin

    def room(self, starts: Sequence[float], now: float) -> int:
        """How many more may start at ``now``, given the start times already recorded.

        A start later than ``now`` counts too: one pool reads the clock, another
        reads it after, claims and commits first; the first then claims with a
        ``now`` earlier than a start it must see. Every window that holds
        ``now`` lies in ``(now - seconds, now + seconds)``, so counting every
        start after ``now - seconds`` keeps all of them within the rate.
        """
        return self.left(self.recent(starts, now))

    def recent(self, starts: Sequence[float], now: float) -> int:
        """How many of ``starts`` a start at ``now`` must count: those after ``now - span``."""
        return sum(1 for start in starts if now - self.span < start)

    def left(self, recent: int) -> int:
        """How many more may start while ``recent`` starts lie inside the window."""
        return max(self.count - recent, 0)

    @property
    def window(self) -> timedelta:
        """How long a start counts (``span``): a start at ``t`` counts at every ``now``
        with ``now - window < t`` (``recent``), the claims' ``rate_starts`` included."""
        return timedelta(seconds=self.span)

    def next_start(self, starts: Sequence[float], now: float) -> float:
        """The earliest time at or after ``now`` at which one more may start."""
        recent = sorted(start for start in starts if now - self.span < start)
        if len(recent) < self.count:
            return now
        # The window must slide past the start that makes it full.
        return recent[len(recent) - self.count] + self.span


@dataclass(frozen=True)
class Breaker:
    """Open after ``failures`` consecutive failures; cool ``cooldown`` s, doubling to the max."""

    failures: int
    cooldown: float = DEFAULT_COOLDOWN
    max_cooldown: float = DEFAULT_MAX_COOLDOWN

    def trips(self, consecutive: int) -> bool:
        """Whether ``consecutive`` failed attempts open a closed breaker."""
        return consecutive >= self.failures

    def cooldown_for(self, openings: int) -> float:
        """The cooldown of the ``openings``-th consecutive opening (1 for the first)."""
        doublings = max(openings - 1, 0)
        if doublings >= 64:  # 2.0**64 times any cooldown is past every maximum
            return self.max_cooldown
        return min(self.cooldown * 2.0**doublings, self.max_cooldown)


@dataclass(frozen=True)
class TargetPolicy:
    """What ``LIMITS[kind]`` asks of each target of the kind beyond the caps."""

    rate: Rate | None = None
    breaker: Breaker | None = None
    ordered: bool = False


@dataclass(frozen=True)
class TargetRow:
    """One target that is not plainly healthy, as ``Intent.objects.targets()`` shows it.

    ``until`` is when it may be tried again: ``None`` once that has passed,
    and for a half-open or failing closed target, which no time holds back.
    """

    kind: str
    target: str
    state: TargetHealth
    failures: int
    until: datetime | None
    last_error: str

    @classmethod
    def at(
        cls,
        now: datetime,
        *,
        kind: str,
        target: str,
        state: str,
        failures: int,
        until: datetime | None,
        last_error: str,
    ) -> TargetRow:
        """The row as it stands at ``now``: a hold or a cooldown that has passed shows no time."""
        health = TargetHealth(state)
        ahead = until if health in BLOCKING and until is not None and until > now else None
        return cls(kind, target, health, failures, ahead, last_error)

    @property
    def blocking(self) -> bool:
        """Whether its intents wait on it now: held or open until later, or probing."""
        return self.until is not None or self.state is TargetHealth.HALF_OPEN

    def as_dict(self) -> dict[str, object]:
        """The row as a plain dict (``state`` a plain string), for JSON and templates."""
        return {**asdict(self), "state": self.state.value}


def margin(seconds: float) -> float:
    """How much longer than its window a start is counted: a tenth, at most ``MARGIN_MAX``."""
    return min(seconds * MARGIN_SHARE, MARGIN_MAX)


def pace_window(held_at: datetime, until: datetime) -> float:
    """The window of the pace a hold from ``held_at`` to ``until`` teaches, in seconds.

    A partner's ``Retry-After`` is how long until its window lets a request
    through again: at most the window, so the hold's length is the best
    guess of it there is. Rounded to a second: the 429s of one burst lengthen
    the hold by the milliseconds between them, and the claims count the
    starts of the targets that share a window in one statement.
    """
    held = round((until - held_at).total_seconds())  # a Retry-After is whole seconds
    return min(max(held, PACE_MIN_WINDOW), PACE_MAX_WINDOW)


def paced_until(held_at: datetime, until: datetime) -> datetime:
    """Until when a target held from ``held_at`` to ``until`` keeps the pace it learned."""
    memory = max(PACE_MEMORY, PACE_MEMORY_WINDOWS * pace_window(held_at, until))
    return until + timedelta(seconds=memory)


def learned_pace(successes: int, held_at: datetime, until: datetime) -> Rate | None:
    """The rate a target may start at after a hold from ``held_at`` to ``until`` (SPEC §14).

    ``successes`` counts the target's attempts that completed from one window
    before the hold began to its end (``pace_window``): what the partner took
    before it refused, and the attempts already on their way when it did;
    counted with a configured rate's margin (``parse_rate``). ``None`` when
    it took none: a partner that refused the first request after a quiet
    spell (a quota another client spent) says nothing of its rate, and a
    pace of one a window would starve its backlog once the quota is back.
    """
    if successes < 1:
        return None
    seconds = pace_window(held_at, until)
    return Rate(successes, seconds, margin(seconds))


def hold_for(seconds: object) -> timedelta:
    """How long ``open_target`` holds a target: a positive, finite number of seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
    if not 0 < seconds < math.inf:  # NaN fails both
        raise ValueError(f"seconds must be a positive, finite number, not {seconds!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"seconds must be shorter than {timedelta.max}, not {seconds!r}") from None


def parse_rate(kind: str, value: Any) -> Rate:
    """``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/Ks"`` (N attempts per K seconds)."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"[{kind!r}]['rate'] must be 'N/s', 'N/m', 'N/h' or 'N/Ks' "
            f"(e.g. '100/20s'), not {value!r}"
        )
    count, many, unit = match.groups()
    seconds = (int(many) if many else 1) * _UNITS[unit]
    if int(count) < 1 or seconds <= 0:
        raise ValueError(
            f"[{kind!r}]['rate'] needs at least 1 attempt per a positive window, not {value!r}"
        )
    return Rate(int(count), seconds, margin(seconds))


def _seconds(kind: str, key: str, value: Any) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not value > 0 or math.isinf(value):  # NaN is not > 0
        raise ValueError(
            f"[{kind!r}]['breaker'][{key!r}] must be a positive number of seconds, not {value!r}"
        )
    return float(value)


def parse_breaker(kind: str, value: Any) -> Breaker:
    """``{"failures": F, "cooldown": C, "max_cooldown": M}``; F required, 0 < C <= M."""
    if not isinstance(value, Mapping):
        raise ValueError(
            f"[{kind!r}]['breaker'] must be a dict like "
            f"{{'failures': 5, 'cooldown': 30, 'max_cooldown': 3600}}, not {value!r}"
        )
    unknown = sorted(str(key) for key in value if key not in BREAKER_KEYS)
    if unknown:
        raise ValueError(
            f"[{kind!r}]['breaker'] has unknown key(s) {', '.join(unknown)}; "
            f"known: {', '.join(BREAKER_KEYS)}"
        )
    failures = value.get("failures")
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
        raise ValueError(
            f"[{kind!r}]['breaker']['failures'] must be a positive integer, not {failures!r}"
        )
    cooldown = _seconds(kind, "cooldown", value.get("cooldown", DEFAULT_COOLDOWN))
    maximum = _seconds(
        kind, "max_cooldown", value.get("max_cooldown", max(DEFAULT_MAX_COOLDOWN, cooldown))
    )
    if cooldown > maximum:
        raise ValueError(
            f"[{kind!r}]['breaker']['cooldown'] ({cooldown:g}) must not exceed "
            f"'max_cooldown' ({maximum:g})"
        )
    return Breaker(failures, cooldown, maximum)


def parse_ordered(kind: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"[{kind!r}]['ordered'] must be True or False, not {value!r}")
    return value


def parse_policy(kind: str, entry: Mapping[str, Any]) -> TargetPolicy | None:
    """The policy in one ``LIMITS`` entry, or ``None`` when it sets none of ``POLICY_KEYS``."""
    if not any(key in entry for key in POLICY_KEYS):
        return None
    rate = parse_rate(kind, entry["rate"]) if "rate" in entry else None
    breaker = parse_breaker(kind, entry["breaker"]) if "breaker" in entry else None
    ordered = parse_ordered(kind, entry["ordered"]) if "ordered" in entry else False
    if rate is None and breaker is None and not ordered:
        return None  # "ordered": False alone asks for nothing
    return TargetPolicy(rate=rate, breaker=breaker, ordered=ordered)


def target_key(kind: str, target: str) -> str:
    """``TargetState``'s key for (kind, target): a hash, as both together may be 2,148 characters.

    The kind's length leads, so that no (kind, target) pair spells another's.
    """
    text = f"{len(kind)}:{kind}{target}"
    return hashlib.sha256(text.encode()).hexdigest()


# -- the transitions of one target's health (SPEC §14) -------------------------


class Event(StrEnum):
    """What an attempt's end, or a claim, tells of its target."""

    SUCCESS = "success"  # completed: the count of consecutive failures starts again
    FAILURE = "failure"  # a handler error, a timeout, or a lease that expired and was taken over
    HOLD = "hold"  # Retry(after=..., hold_target=True): hold the target until ``until``
    # Neither: a snooze, a Stop, a release at shutdown. Matters only for a
    # half-open probe, whose target is probed again by another intent.
    NEUTRAL = "neutral"


@dataclass(frozen=True)
class Health:
    """One ``TargetState`` row's changing part; no row is ``CLOSED`` with nothing counted.

    ``probe`` is the id of the half-open target's probe once one was claimed;
    ``""`` while half-open means that the next claim of a pool that read the
    row may take one intent of the target as the probe.

    ``held_at`` is when the last hold a handler asked for began (a hold by
    hand sets none), and ``paced_until`` how long the pace that hold teaches
    lasts (``learned_pace``); ``until`` then keeps the hold's end, the state
    closed or not, as the pace's window is measured from both.
    """

    state: TargetHealth = TargetHealth.CLOSED
    failures: int = 0
    openings: int = 0
    until: Any = None  # a datetime: when a held or open target may be tried again
    last_error: str = ""
    probe: str = ""
    held_at: Any = None  # a datetime: when the hold that teaches a pace began
    paced_until: Any = None  # a datetime: when that pace is over

    @property
    def plain(self) -> bool:
        """Whether the target is plainly healthy: its row can go."""
        return self.state == TargetHealth.CLOSED and self.failures == 0 and self.paced_until is None

    def unpaced(self, now: Any) -> Health:
        """This health without a pace that is over at ``now``."""
        if self.paced_until is None or self.paced_until > now:
            return self
        until = self.until if self.state in BLOCKING else None
        return replace(self, until=until, held_at=None, paced_until=None)

    def blocks(self, now: Any, exempt: bool = False) -> bool:
        """Whether a claim at ``now`` leaves the target's intents alone (``target_open`` in
        sql/common.sql says the same); ``exempt``: the claimer knows it is probing."""
        if self.state == TargetHealth.CLOSED:
            return False
        if self.state == TargetHealth.HELD:
            return self.until is not None and self.until > now
        if self.state == TargetHealth.HALF_OPEN and not self.probe:
            return not exempt
        return True


def opened(health: Health, breaker: Breaker, now: Any, error: str) -> Health:
    """``health`` opened once more: the cooldown doubles with each consecutive opening.

    A pace learned before is dropped: the breaker's probes pace the target now.
    """
    openings = health.openings + 1
    return replace(
        health,
        state=TargetHealth.OPEN,
        openings=openings,
        until=now + _delta(breaker.cooldown_for(openings)),
        last_error=error,
        probe="",
        held_at=None,
        paced_until=None,
    )


def after(
    health: Health | None,
    event: Event,
    *,
    now: Any,
    breaker: Breaker | None,
    intent: str = "",
    until: Any = None,
    error: str = "",
) -> Health | None:
    """The target's health after ``event`` of the attempt of ``intent`` at ``now``.

    ``None`` is a plainly healthy target (no row). Failures count only for a
    kind with a ``breaker``; a hold (``until``) applies to any kind. An
    attempt that was already running when the target opened ends as it
    ends: its failure only counts, its success closes the breaker.
    """
    current = health or Health()
    probe = current.state == TargetHealth.HALF_OPEN and bool(intent) and current.probe == intent
    if event == Event.SUCCESS:
        if current.state == TargetHealth.HELD:  # the partner asked for the wait: it stays
            return replace(current, failures=0, openings=0, probe="")
        if current.paced_until is not None:  # healthy, and still paced
            return Health(
                until=current.until, held_at=current.held_at, paced_until=current.paced_until
            )
        return None
    if event == Event.HOLD:
        return _held(current, probe, now, until)
    if event == Event.NEUTRAL:
        if probe:  # no verdict: the next claim probes with another intent
            return replace(current, state=TargetHealth.HALF_OPEN, until=None, probe="")
        return health
    if breaker is None:
        return health
    counted = replace(current, failures=current.failures + 1, last_error=error)
    if probe:
        return opened(counted, breaker, now, error)
    if current.state in (TargetHealth.CLOSED, TargetHealth.HELD) and breaker.trips(
        counted.failures
    ):
        return opened(counted, breaker, now, error)
    return counted


def _held(current: Health, probe: bool, now: Any, until: Any) -> Health:
    """``current`` after a handler asked to hold its target until ``until`` (a 429).

    A hold that begins (the target was not held until later) starts the
    window its pace is learned over (``held_at``); a 429 within it only
    lengthens it. A half-open target with another probe out is left to that
    probe's verdict. A breaker's target (open, or its probe answered 429)
    stays open, longer, and learns no pace: its probes pace it (``opened``).
    """
    if current.state == TargetHealth.HALF_OPEN and not probe:
        return current
    holding = current.state in BLOCKING and current.until is not None and current.until > now
    later = max(current.until, until) if holding else until
    if probe or current.state == TargetHealth.OPEN:
        return replace(current, state=TargetHealth.OPEN, until=later, probe="")
    held_at = current.held_at if holding and current.held_at is not None else now
    return replace(
        current,
        state=TargetHealth.HELD,
        until=later,
        probe="",
        held_at=held_at,
        paced_until=paced_until(held_at, later),
    )


def reaped(
    health: Health,
    probe_state: str | None,
    lease_over: bool,
    *,
    now: Any,
    breaker: Breaker | None,
) -> Health | None:
    """A half-open target whose probe no pool will report on: what became of it.

    ``probe_state`` is the probe intent's state (``None``: gone), ``lease_over``
    whether a running probe's lease has expired. A probe whose lease expired
    failed; one completed (in the handler's ``attempt.atomic()``) succeeded;
    one moved by an operator gave no verdict, so another intent probes.
    """
    if probe_state == "running" and not lease_over:
        return health
    if breaker is None:  # the kind has no breaker any more: nothing holds the target
        return None
    if probe_state == "running":
        error = "the probe's lease expired"
        return after(
            health, Event.FAILURE, now=now, breaker=breaker, intent=health.probe, error=error
        )
    if probe_state == "completed":
        return after(health, Event.SUCCESS, now=now, breaker=breaker, intent=health.probe)
    return after(health, Event.NEUTRAL, now=now, breaker=breaker, intent=health.probe)


def _delta(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)
