"""Per-kind concurrency limits (``INTENTS["LIMITS"]``, SPEC §10): the setting and the rule.

A limit caps how many intents of a kind run at once across every pool on the
database (``running``), and how many of them share one ``target``
(``per_target``). Only live leases count: an expired lease does not, so a
crashed pool's slots free themselves when its leases run out. A due intent
that does not fit stays ``pending``, in its place in the claim order, and
takes no worker.

An entry may also give its kind a ``timeout`` (SPEC §16): how long one
attempt may run before the pool cancels it. It concerns the pool running
the attempt, not the claim, so ``parse`` returns it apart, and a kind with
only a timeout has no ``Limit``: its claims stay on the unlimited path.

This module holds the rule in Python: ``parse`` checks the setting,
``Admission`` admits due intents in claim order against the live leases, and
``held_back`` counts what a limit keeps waiting (the admin's summary and the
gauges). The claim applies it in the store, under a lock that serialises the
claims of the limited kinds (``store/limited.py``): SQLite and MariaDB
through ``Admission``, PostgreSQL in the claim statement itself
(``store/postgresql/limited.py``), which counts the live leases and admits
in order with window functions, to the same rule.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django_intents.rules.identity import check_text
from django_intents.rules.targets import POLICY_KEYS, Rate, TargetPolicy, parse_policy

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow

CAPS = ("running", "per_target")
KEYS = (*CAPS, "timeout", *POLICY_KEYS)


@dataclass(frozen=True)
class Limit:
    """The caps of one kind; ``None`` leaves that side unlimited."""

    running: int | None = None
    per_target: int | None = None


Limits = Mapping[str, Limit]
Running = Mapping[tuple[str, str], int]  # live leases per (kind, target)
Rates = Mapping[str, Rate]
Paces = Mapping[tuple[str, str], Rate]  # learned per (kind, target): rules.targets.learned_pace


def rate_for(rates: Rates, paces: Paces, kind: str, target: str) -> Rate | None:
    """The rate a target's starts are counted by: its kind's, else the pace a hold
    taught it (SPEC §14), else none."""
    return rates.get(kind) or paces.get((kind, target))


@dataclass(frozen=True)
class Started:
    """The starts of one rated (kind, target) inside its window at a claim's ``now``."""

    count: int
    oldest: datetime


T = TypeVar("T")


def parse(
    value: Any,
) -> tuple[dict[str, Limit], dict[str, float], dict[str, TargetPolicy]]:
    """``INTENTS["LIMITS"]`` checked: the claims' caps, the timeouts, the targets' policies.

    Raises ``ValueError`` naming what is wrong. Refused: anything but a
    non-empty dict of kind -> non-empty dict, a key other than ``running``,
    ``per_target`` and ``timeout``, a cap that is not a positive ``int``
    (``True`` included, though Python calls it 1), and a timeout that is not
    a positive, finite number of seconds (``int`` or ``float``, not ``bool``).
    An empty dict is refused at both levels: it limits nothing, so it is a
    mistake more often than a choice; leave the key out instead. ``rate``,
    ``breaker`` and ``ordered`` (SPEC §14) are checked by ``rules/targets.py``.
    """
    if not isinstance(value, Mapping):
        raise ValueError(
            f"must be a dict of kind -> {{'running': N, 'per_target': K, 'timeout': S}}, "
            f"not {value!r}"
        )
    if not value:
        raise ValueError("is empty: it limits nothing; leave LIMITS out or name a kind")
    limits: dict[str, Limit] = {}
    timeouts: dict[str, float] = {}
    policies: dict[str, TargetPolicy] = {}
    for kind, caps in value.items():
        try:
            check_text("kind", kind)
        except ValueError as exc:
            raise ValueError(f"has a bad kind {kind!r}: {exc}") from None
        if not isinstance(caps, Mapping) or not caps:
            raise ValueError(
                f"[{kind!r}] must be a non-empty dict with any of {', '.join(KEYS)}, not {caps!r}"
            )
        unknown = sorted(str(key) for key in caps if key not in KEYS)
        if unknown:
            raise ValueError(
                f"[{kind!r}] has unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"
            )
        for key, cap in caps.items():
            if key == "timeout":
                timeouts[kind] = _seconds(kind, cap)
            elif key in POLICY_KEYS:
                continue
            elif isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ValueError(f"[{kind!r}][{key!r}] must be a positive integer, not {cap!r}")
        if any(key in caps for key in CAPS):
            limits[kind] = Limit(running=caps.get("running"), per_target=caps.get("per_target"))
        policy = parse_policy(kind, caps)
        if policy is not None:
            policies[kind] = policy
    return limits, timeouts, policies


def _seconds(kind: str, value: Any) -> float:
    """A timeout: a positive, finite number of seconds; ``inf`` is no timeout, so left out."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not value > 0 or math.isinf(value):  # NaN is not > 0
        raise ValueError(
            f"[{kind!r}]['timeout'] must be a positive number of seconds, not {value!r}"
        )
    return float(value)


def applying(limits: Mapping[str, T], kinds: Iterable[str] | None) -> dict[str, T]:
    """The limits (or rates) a claim of ``kinds`` (``None``: every kind) must apply."""
    if kinds is None:
        return dict(limits)
    return {kind: limits[kind] for kind in kinds if kind in limits}


def rates_of(policies: Mapping[str, TargetPolicy]) -> dict[str, Rate]:
    """The kinds that have a ``rate`` (SPEC §14), and their rates."""
    return {kind: policy.rate for kind, policy in policies.items() if policy.rate is not None}


def ordered_kinds(policies: Mapping[str, TargetPolicy], kinds: Iterable[str] | None) -> list[str]:
    """The kinds with ``"ordered": True`` (SPEC §14) that a claim of ``kinds`` takes."""
    ordered = sorted(kind for kind, policy in policies.items() if policy.ordered)
    if kinds is None:
        return ordered
    asked = set(kinds)
    return [kind for kind in ordered if kind in asked]


def paced_kinds(policies: Mapping[str, TargetPolicy]) -> frozenset[str]:
    """The kinds whose claimed intents must start at once, not wait in a pool's queue
    (``pacing``), among every kind of ``policies``."""
    return pacing(rates_of(policies), ordered_kinds(policies, None))


def pacing(rated: Iterable[str], ordered: Iterable[str]) -> frozenset[str]:
    """The rated and the ordered kinds: those whose claimed intents must start at once.

    A rated kind's claim is the start its rate counts: queued, it would start
    late and bunched with the next window's. An ordered target's head holds
    its whole target while it waits. A pool that queues other kinds ahead
    caps these per claim to what starts now (``Admission``'s ``paced``).
    """
    return frozenset(rated) | frozenset(ordered)


def limited_kinds(limits: Limits, policies: Mapping[str, TargetPolicy]) -> frozenset[str]:
    """The kinds whose claims take the limited path: those with caps, and the ordered ones.

    A pool's claims of them complete its finished claims first (``Riders``),
    and a claim that finds nothing of them does not prove that nothing is due.
    """
    return frozenset(limits) | frozenset(ordered_kinds(policies, None))


def heads(
    intents: Iterable[IntentRow],
    ordered: Collection[str],
    head_of: Mapping[tuple[str, str], str | None],
) -> tuple[list[IntentRow], set[str]]:
    """Of due ``intents``, those that order lets start, and the ids of those it keeps waiting.

    An intent of an ordered kind may start only when no intent of its kind and
    target created before it is ``pending`` or ``running`` (SPEC §14): when it
    is its target's head, the oldest of those (``head_of``, per (kind, target),
    as the table says). Intents of other kinds are not ordered.
    """
    free: list[IntentRow] = []
    behind: set[str] = set()
    for intent in intents:
        if intent.kind in ordered and head_of.get((intent.kind, intent.target)) != intent.id:
            behind.add(intent.id)
        else:
            free.append(intent)
    return free, behind


class Admission:
    """Which due intents fit under the limits, given the leases live right now,
    and under the rates, given the starts inside each window (``started``) at ``now``.

    A rated (kind, target) with ``count`` starts in its window admits
    ``Rate.left(count)`` more; each admitted intent is a start at ``now``.
    An ordered kind (SPEC §14) runs at most one intent per target, its head:
    to the count it is a ``per_target`` of 1, whatever its ``LIMITS`` say,
    so a target whose head runs is full and left out of the scan. Whether a
    due intent is its target's head is asked of the database (``store/limited.py``).
    ``paced``, when given, is how many intents of rated and ordered kinds
    (``paced_kinds``) this claim may take at most, whatever their windows and
    heads leave: a pool whose claims queue other kinds' intents ahead takes
    theirs only for what starts at once (``Demand.paced``). ``paces`` are the
    rates a hold taught single targets of kinds without one: such a target
    is admitted as a rated one, and counts against ``paced`` too.
    """

    def __init__(
        self,
        limits: Limits,
        running: Running,
        ordered: Iterable[str] = (),
        *,
        rates: Rates | None = None,
        started: Mapping[tuple[str, str], Started] | None = None,
        now: datetime | None = None,
        paced: int | None = None,
        paces: Paces | None = None,
    ) -> None:
        self._ordered = frozenset(ordered)
        self._limits = dict(limits)
        for kind in self._ordered:
            self._limits[kind] = replace(limits.get(kind, Limit()), per_target=1)
        self._pairs: Counter[tuple[str, str]] = Counter(running)
        self._kinds: Counter[str] = Counter()
        self._rates = rates or {}
        self._paces = paces or {}
        self._started: Counter[tuple[str, str]] = Counter()
        self._oldest: dict[tuple[str, str], datetime] = {}
        for pair, seen in (started or {}).items():
            self._started[pair] = seen.count
            self._oldest[pair] = seen.oldest
        if (self._rates or self._paces) and now is None:
            raise ValueError("an admission under rates needs the claim's now")
        self._now = now
        self._paced = paced
        self._paced_kinds = pacing(self._rates, self._ordered)
        self.refused = 0
        for (kind, _), count in running.items():
            self._kinds[kind] += count

    def full(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The kinds, and the (kind, target) pairs, that can take nothing more now.

        A claim leaves them out of its scan, so a dead target's backlog at the
        head of the queue does not crowd out the intents behind it.
        """
        kinds = [
            kind
            for kind, limit in self._limits.items()
            if limit.running is not None and self._kinds[kind] >= limit.running
        ]
        if self._paced is not None and self._paced <= 0:
            kinds += sorted(kind for kind in self._paced_kinds if kind not in kinds)
        pairs = [
            (kind, target)
            for (kind, target), count in self._pairs.items()
            if kind not in kinds
            and (cap := self._limits[kind].per_target) is not None
            and count >= cap
        ]
        spent = self._spent()
        if self._paced is not None and self._paced <= 0:
            spent += sorted(self._paces)
        capped = set(pairs)
        for pair in spent:
            if pair[0] not in kinds and pair not in capped:
                capped.add(pair)
                pairs.append(pair)
        return kinds, pairs

    def _rate(self, kind: str, target: str) -> Rate | None:
        """The rate of a target: its kind's, else the pace a hold taught it, if any."""
        return rate_for(self._rates, self._paces, kind, target)

    def _spent(self) -> list[tuple[str, str]]:
        """The rated and paced (kind, target) pairs whose window has no room left."""
        return [
            pair
            for pair, count in self._started.items()
            if (rate := self._rate(*pair)) is not None and not rate.left(count)
        ]

    def reopens(self) -> datetime | None:
        """When the first rated target without room may start again, if any.

        Its oldest start in the window plus the window: exact when the window
        holds ``N`` starts, as the claims keep it; earlier (a claim that finds
        it still full, then waits again) if a smaller rate was configured since.
        """
        times = [
            self._oldest[pair] + rate.window
            for pair in self._spent()
            if (rate := self._rate(*pair)) is not None
        ]
        return min(times, default=None)

    def fits(self, kind: str, target: str) -> bool:
        """Whether one more intent of ``kind`` for ``target`` may start; if so, count it."""
        limit = self._limits.get(kind)
        rate = self._rate(kind, target)
        if limit is not None:
            if limit.running is not None and self._kinds[kind] >= limit.running:
                return False
            if limit.per_target is not None and self._pairs[kind, target] >= limit.per_target:
                return False
        if rate is not None and not rate.left(self._started[kind, target]):
            return False
        if self._paced is not None and (kind in self._paced_kinds or (kind, target) in self._paces):
            if self._paced <= 0:
                return False
            self._paced -= 1
        if limit is not None:
            self._kinds[kind] += 1
            self._pairs[kind, target] += 1
        if rate is not None and self._now is not None:
            self._started[kind, target] += 1
            self._oldest.setdefault((kind, target), self._now)
        return True

    def admit(self, intents: Iterable[IntentRow], limit: int) -> list[IntentRow]:
        """The first ``limit`` of ``intents`` (in claim order) that fit, counting each one in;
        ``refused`` counts those passed over on the way."""
        chosen: list[IntentRow] = []
        for intent in intents:
            if len(chosen) >= limit:
                break
            if self.fits(intent.kind, intent.target):
                chosen.append(intent)
            else:
                self.refused += 1
        return chosen


def held_back(
    limits: Limits, due: Mapping[tuple[str, str], int], running: Running
) -> dict[str, int]:
    """Per limited kind, how many due intents its limit keeps from running now.

    ``due`` counts the due intents per (kind, target), ``running`` the live
    leases. What fits is, per target, the room ``per_target`` leaves, and for
    the kind at most the room ``running`` leaves; the rest is held back.
    """
    live: Counter[str] = Counter()
    for (kind, _), count in running.items():
        live[kind] += count
    wanted: Counter[str] = Counter()
    fitting: Counter[str] = Counter()
    for (kind, target), count in due.items():
        limit = limits.get(kind)
        if limit is None:
            continue
        wanted[kind] += count
        room = count
        if limit.per_target is not None:
            room = min(count, max(limit.per_target - running.get((kind, target), 0), 0))
        fitting[kind] += room
    held = {}
    for kind, limit in limits.items():
        fits = fitting[kind]
        if limit.running is not None:
            fits = min(fits, max(limit.running - live[kind], 0))
        held[kind] = wanted[kind] - fits
    return held
