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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_intents.rules.identity import check_text

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow

CAPS = ("running", "per_target")
KEYS = (*CAPS, "timeout")


@dataclass(frozen=True)
class Limit:
    """The caps of one kind; ``None`` leaves that side unlimited."""

    running: int | None = None
    per_target: int | None = None


Limits = Mapping[str, Limit]
Running = Mapping[tuple[str, str], int]  # live leases per (kind, target)


def parse(value: Any) -> tuple[dict[str, Limit], dict[str, float]]:
    """``INTENTS["LIMITS"]`` checked, as the claims' caps and the attempts' timeouts.

    Raises ``ValueError`` naming what is wrong. Refused: anything but a
    non-empty dict of kind -> non-empty dict, a key other than ``running``,
    ``per_target`` and ``timeout``, a cap that is not a positive ``int``
    (``True`` included, though Python calls it 1), and a timeout that is not
    a positive, finite number of seconds (``int`` or ``float``, not ``bool``).
    An empty dict is refused at both levels: it limits nothing, so it is a
    mistake more often than a choice; leave the key out instead.
    """
    if not isinstance(value, Mapping):
        raise ValueError(
            f"must be a dict of kind -> {{'running': N, 'per_target': K, 'timeout': S}}, "
            f"not {value!r}"
        )
    if not value:
        raise ValueError("is empty: it limits nothing; leave LIMITS out or name a kind")
    limits, timeouts = {}, {}
    for kind, caps in value.items():
        try:
            check_text("kind", kind)
        except ValueError as exc:
            raise ValueError(f"has a bad kind {kind!r}: {exc}") from None
        if not isinstance(caps, Mapping) or not caps:
            raise ValueError(
                f"[{kind!r}] must be a non-empty dict with 'running', 'per_target' and/or "
                f"'timeout', not {caps!r}"
            )
        unknown = sorted(str(key) for key in caps if key not in KEYS)
        if unknown:
            raise ValueError(
                f"[{kind!r}] has unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"
            )
        for key, cap in caps.items():
            if key == "timeout":
                timeouts[kind] = _seconds(kind, cap)
            elif isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ValueError(f"[{kind!r}][{key!r}] must be a positive integer, not {cap!r}")
        if any(key in caps for key in CAPS):
            limits[kind] = Limit(running=caps.get("running"), per_target=caps.get("per_target"))
    return limits, timeouts


def _seconds(kind: str, value: Any) -> float:
    """A timeout: a positive, finite number of seconds; ``inf`` is no timeout, so left out."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not value > 0 or math.isinf(value):  # NaN is not > 0
        raise ValueError(
            f"[{kind!r}]['timeout'] must be a positive number of seconds, not {value!r}"
        )
    return float(value)


def applying(limits: Limits, kinds: Iterable[str] | None) -> dict[str, Limit]:
    """The limits a claim of ``kinds`` (``None``: every kind) must apply."""
    if kinds is None:
        return dict(limits)
    return {kind: limits[kind] for kind in kinds if kind in limits}


class Admission:
    """Which due intents fit under the limits, given the leases live right now."""

    def __init__(self, limits: Limits, running: Running) -> None:
        self._limits = limits
        self._pairs: Counter[tuple[str, str]] = Counter(running)
        self._kinds: Counter[str] = Counter()
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
        pairs = [
            (kind, target)
            for (kind, target), count in self._pairs.items()
            if kind not in kinds
            and (cap := self._limits[kind].per_target) is not None
            and count >= cap
        ]
        return kinds, pairs

    def fits(self, kind: str, target: str) -> bool:
        """Whether one more intent of ``kind`` for ``target`` may run; if so, count it."""
        limit = self._limits.get(kind)
        if limit is None:
            return True
        if limit.running is not None and self._kinds[kind] >= limit.running:
            return False
        if limit.per_target is not None and self._pairs[kind, target] >= limit.per_target:
            return False
        self._kinds[kind] += 1
        self._pairs[kind, target] += 1
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
