"""The health of each (kind, target) in ``TargetState``: read, decided, written (SPEC §14).

The claims leave alone the targets that block (``held_targets`` in
``sql/common.sql``); this module writes the rows they read. Every change
is decided by ``rules/targets.after`` on the row as it is, locked in the
writer's transaction, so that two pools that record the failures of one
target at once both count: a row is inserted first when an event needs
one (``target_insert`` ignores the known key), then locked
(``target_rows``), then saved or deleted. A plainly healthy target has no
row: the common case of a success is one lookup by primary key that finds
nothing.

A half-open target is probed by one intent. ``watch`` runs in a pool's
claims of kinds with a breaker, twice a second: it half-opens the targets
whose cooldown is over, hands the pool the keys of those awaiting a probe
(which its next claims may take one intent of, ``ClaimFilters.exempt``),
and settles the probes that no pool will report on (a lease that expired,
an operator's move). ``take_probes`` then decides, after a claim, which
claimer's intent is each target's probe: a guarded update that one claimer
wins; the intents the others took of it are given back unstarted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_intents.rules.targets import (
    Breaker,
    Event,
    Health,
    Rate,
    TargetHealth,
    after,
    learned_pace,
    pace_window,
    reaped,
    target_key,
)
from django_intents.store.statements import bind
from django_intents.store.table import Table

if TYPE_CHECKING:
    from django_intents.store.base import Backend

# (kind, target, state, previous): one change, for ``target_state_changed``.
Change = tuple[str, str, str, str]
Pair = tuple[str, str]  # (kind, target)


@dataclass(frozen=True)
class TargetEvent:
    """What one attempt's end (or a claim's takeover of an expired lease) says of its target."""

    kind: str
    target: str
    event: Event
    intent: str = ""
    until: datetime | None = None  # a hold's end
    error: str = ""

    @property
    def key(self) -> str:
        return target_key(self.kind, self.target)


@dataclass(frozen=True)
class Row:
    key: str
    kind: str
    target: str
    health: Health


def record(
    backend: Backend,
    events: Sequence[TargetEvent],
    *,
    now: datetime,
    breakers: Mapping[str, Breaker],
) -> list[Change]:
    """Apply ``events`` in order in the caller's transaction (or one of its own); the changes."""
    if not events:
        return []
    table = backend.table
    wanted = list(dict.fromkeys(event.key for event in events))
    needed = {
        event.key: event
        for event in events
        if event.event == Event.HOLD or (event.event == Event.FAILURE and event.kind in breakers)
    }
    with backend.write_transaction(), table.cursor() as cursor:
        if needed:
            at = table.dt(now)
            rows = [
                (
                    key,
                    e.kind,
                    e.target,
                    TargetHealth.CLOSED.value,
                    0,
                    0,
                    None,
                    "",
                    "",
                    None,
                    None,
                    at,
                )
                for key, e in needed.items()
            ]
            table.execute(cursor, "target_insert", rows=rows)
        locked = table.execute(cursor, "target_rows", keys=wanted).fetchall()
        found = _rows(backend, locked)
        before = dict(found)
        current: dict[str, Health | None] = {key: row.health for key, row in found.items()}
        names = {event.key: (event.kind, event.target) for event in events}
        for event in events:
            current[event.key] = after(
                current.get(event.key),
                event.event,
                now=now,
                breaker=breakers.get(event.kind),
                intent=event.intent,
                until=event.until,
                error=event.error,
            )
        return _write(backend, cursor, before, current, names, now)


def watch(
    backend: Backend, *, kinds: Sequence[str], now: datetime, breakers: Mapping[str, Breaker]
) -> tuple[dict[str, tuple[str, str]], list[Change]]:
    """Half-open the cooled targets of ``kinds``, settle lost probes; the targets awaiting
    a probe (key: (kind, target)), and the changes."""
    table = backend.table
    rows = _rows(backend, table.run("target_watch", kinds=list(kinds), now=table.dt(now)))
    if not rows:
        return {}, []
    states = _probe_states(backend, rows.values())
    moved = {
        key
        for key, row in rows.items()
        if row.health.state == TargetHealth.OPEN or _lost(row.health, states, now)
    }
    changes: list[Change] = []
    if moved:
        with backend.write_transaction(), table.cursor() as cursor:
            locked = table.execute(cursor, "target_rows", keys=sorted(moved)).fetchall()
            found = _rows(backend, locked)
            # Read again under the rows' locks: another pool may have half-opened a
            # target and taken its probe since the look, and a probe the look did
            # not see is not lost. The recorder locks the row to report a probe,
            # so its state is read here before, never during, that report.
            states = _probe_states(backend, found.values())
            current: dict[str, Health | None] = {}
            for key, row in found.items():
                health, breaker = row.health, breakers.get(row.kind)
                if health.state == TargetHealth.OPEN and health.until and health.until <= now:
                    current[key] = replace(
                        health, state=TargetHealth.HALF_OPEN, until=None, probe=""
                    )
                elif _lost(health, states, now):
                    state, lease = states.get(health.probe, (None, None))
                    current[key] = reaped(
                        health, state, lease is not None and lease <= now, now=now, breaker=breaker
                    )
            names = {key: (row.kind, row.target) for key, row in found.items()}
            changes = _write(backend, cursor, found, current, names, now)
        rows = _rows(backend, table.run("target_watch", kinds=list(kinds), now=table.dt(now)))
    probing = {
        key: (row.kind, row.target)
        for key, row in rows.items()
        if row.health.state == TargetHealth.HALF_OPEN and not row.health.probe
    }
    return probing, changes


def take_probe(backend: Backend, key: str, intent: str, *, now: datetime) -> bool:
    """Make ``intent`` the probe of the half-open target ``key``, unless another claim did."""
    return bool(backend.table.count("target_probe", id=intent, key=key, now=backend.table.dt(now)))


def ended(backend: Backend, *, now: datetime, rated: Iterable[str] = ()) -> list[Change]:
    """Holds and paces that are over: each row goes, or keeps what it still counts (the
    failures, a pace), as closed.

    A pace that ends takes its target's starts (``TargetStart``) with it, unless
    its kind has a ``rate`` of its own (``rated``), which counts them: only the
    claims of a paced target prune them, and once its pace is over none may come.
    """
    table = backend.table
    rows = _rows(backend, table.run("target_ended", now=table.dt(now)))
    if not rows:
        return []
    with backend.write_transaction(), table.cursor() as cursor:
        locked = table.execute(cursor, "target_rows", keys=sorted(rows)).fetchall()
        found = _rows(backend, locked)
        current: dict[str, Health | None] = {}
        for key, row in found.items():
            health = row.health
            if health.state == TargetHealth.HELD and health.until and health.until <= now:
                until = health.until if health.paced_until is not None else None
                health = replace(
                    health, state=TargetHealth.CLOSED, openings=0, until=until, probe=""
                )
                if health.held_at is not None and not _successes(
                    table, row.kind, row.target, health.held_at, health.until, now
                ):  # the hold taught no pace (``learned_pace``): nothing to keep it for
                    health = replace(health, until=None, held_at=None, paced_until=None)
            elif health.state != TargetHealth.CLOSED:
                continue
            kept = health.unpaced(now)
            current[key] = None if kept.plain else kept
        rated_kinds = set(rated)
        unpaced = [
            key
            for key, health in sorted(current.items())
            if found[key].health.paced_until is not None
            and (health is None or health.paced_until is None)
            and found[key].kind not in rated_kinds
        ]
        if unpaced:
            table.execute(cursor, "pace_starts_delete", keys=unpaced)
        names = {key: (row.kind, row.target) for key, row in found.items()}
        return _write(backend, cursor, found, current, names, now)


def _probe_states(backend: Backend, rows: Iterable[Row]) -> dict[str, tuple[str, Any]]:
    """The state and lease of each probe out among ``rows``, by the probe's id."""
    table = backend.table
    probes = sorted({row.health.probe for row in rows if row.health.probe})
    if not probes:
        return {}
    lease_of = table.converter(table.model, "claim_until")
    return {
        id: (state, lease_of(lease))
        for id, state, lease in table.run("probe_states", ids=probes)  # noqa: A001
    }


def _lost(health: Health, states: Mapping[str, tuple[str, Any]], now: datetime) -> bool:
    """Whether a half-open target's probe is out of any pool's hands."""
    if health.state != TargetHealth.HALF_OPEN or not health.probe:
        return False
    state, lease = states.get(health.probe, (None, None))
    return state != "running" or lease is None or lease <= now


def _rows(backend: Backend, fetched: Iterable[Sequence[Any]]) -> dict[str, Row]:
    convert = backend.table.converter(backend.table.target_model, "until")
    rows = {}
    for key, kind, target, state, failures, openings, until, error, probe, *paced in fetched:
        held_at, paced_until = (convert(value) for value in paced)
        health = Health(
            TargetHealth(state),
            int(failures),
            int(openings),
            convert(until),
            error,
            probe,
            held_at,
            paced_until,
        )
        rows[key] = Row(key, kind, target, health)
    return rows


def _write(
    backend: Backend,
    cursor: Any,
    before: Mapping[str, Row],
    after_: Mapping[str, Health | None],
    names: Mapping[str, tuple[str, str]],
    now: datetime,
) -> list[Change]:
    """Save or delete each row whose health changed; the state changes among them."""
    table = backend.table
    at = table.dt(now)
    saves: list[list[Any]] = []
    deletes: list[str] = []
    changes: list[Change] = []
    for key, health in after_.items():
        old = before[key].health if key in before else None
        if health is not None and health.plain:
            health = None
        if health == old:
            continue
        if health is None:
            if old is not None:
                deletes.append(key)
        else:
            saves.append(
                [
                    health.state.value,
                    health.failures,
                    health.openings,
                    _dt(table, health.until),
                    health.last_error,
                    health.probe,
                    _dt(table, health.held_at),
                    _dt(table, health.paced_until),
                    at,
                    key,
                ]
            )
        was = (old.state if old else TargetHealth.CLOSED).value
        now_state = (health.state if health else TargetHealth.CLOSED).value
        if was != now_state:
            kind, target = names[key]
            changes.append((kind, target, now_state, was))
    if saves:
        statement, _ = bind(table.sql.target_save, {})
        cursor.executemany(statement, saves)
    if deletes:
        table.execute(cursor, "target_delete", keys=deletes)
    return changes


def _dt(table: Any, value: datetime | None) -> Any:
    return None if value is None else table.dt(value)


def paces(backend: Backend, *, now: datetime, kinds: Sequence[str] | None) -> dict[Pair, Rate]:
    """The pace each target of ``kinds`` (``None``: every kind) learned from a handler's
    hold and keeps at ``now`` (``rules.targets.learned_pace``).

    While the hold lasts its target is not claimed at all; the pace binds
    from the hold's end. The successes are counted from a window before the
    hold began to its end, or to ``now`` while it lasts: a claimer that reads
    the pace during the hold sees the attempts that were on their way settle.
    """
    table = backend.table
    convert = table.converter(table.target_model, "until")
    asked = None if kinds is None else set(kinds)
    found: dict[Pair, Rate] = {}
    for kind, target, held_at, until in table.run("target_paces", now=table.dt(now)):
        if asked is not None and kind not in asked:
            continue
        held_at, until = convert(held_at), convert(until)
        pace = learned_pace(_successes(table, kind, target, held_at, until, now), held_at, until)
        if pace is not None:
            found[kind, target] = pace
    return found


def _successes(
    table: Table, kind: str, target: str, held_at: datetime, until: datetime, now: datetime
) -> int:
    """The target's attempts that completed from a pace's window before ``held_at`` to
    ``until`` (or ``now``, while the hold lasts): what ``learned_pace`` learns from."""
    window = timedelta(seconds=pace_window(held_at, until))
    [(count,)] = table.run(
        "pace_successes",
        kind=kind,
        target=target,
        since=table.dt(held_at - window),
        until=table.dt(min(until, now)),
    )
    return int(count)
