"""The queue against a model of SPEC §3: random call sequences, every result predicted.

A Hypothesis state machine drives ``Intent.objects`` with several logical
workers that keep the tokens of their claims (fresh and stale), and a clock
that moves only through ``now=``. ``QueueModel``, SPEC §3 in plain Python,
predicts every return value and, after every step, every column of every row.
The invariants hold whatever the model says: a running intent has a token and
a lease, attempts never decrease, a finished intent never changes again.

``INTENTS_HYPOTHESIS_EXAMPLES`` raises the number of examples for a longer hunt.
"""

from __future__ import annotations

import copy
import os
import string
from collections.abc import Collection
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test.utils import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_intents import backoff, intent_id
from django_intents.models import Intent

from .conftest import T0, intents

EXAMPLES = int(os.environ.get("INTENTS_HYPOTHESIS_EXAMPLES", "50"))
DEFAULT_LEASE = 30  # tests/settings.py: INTENTS = {"LEASE": 30}
WORKERS = ("w1", "w2", "w3")
KINDS = ("webhook", "push", "job")
UNKNOWN_ID = "f" * 64
FORGED_TOKEN = "0" * 32
HEX_DIGITS = frozenset(string.hexdigits.lower())

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.sampled_from([0.5, -2.25, 1e-3])
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
)
payloads = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("ab", max_size=2), inner),
    max_leaves=6,
)
steps = st.sampled_from([0, 0.000001, 0.5, 1, 10, 29.999999, 30, 31, 300, 7200])
leases = st.sampled_from([1, None, 0.000001, 2.5, 30, timedelta(seconds=10), timedelta(minutes=5)])
kind_filters = st.sampled_from([None, KINDS, ["webhook"], ("push", "job"), {"job"}, [], ["nope"]])
causes = st.sampled_from(["boom", None, "", ValueError("bad value"), "two\nlines ✓"])


@dataclass
class Row:
    """One intent, as SPEC §2 describes it."""

    id: str
    kind: str
    event_id: str
    target: str
    payload: Any
    state: str
    attempts: int
    next_at: datetime
    created_at: datetime
    updated_at: datetime
    last_error: str
    claim_token: str
    claim_until: datetime | None

    def order(self) -> tuple[datetime, datetime, str]:
        return (self.next_at, self.created_at, self.id)

    def move_to(self, state: str, now: datetime) -> None:
        """Change state; only ``claim`` makes an intent running, so the claim goes."""
        self.state, self.updated_at = state, now
        self.claim_token, self.claim_until = "", None


COLUMNS = tuple(f.name for f in fields(Row))
STATE, ATTEMPTS = COLUMNS.index("state"), COLUMNS.index("attempts")
# SPEC §3 says an exhausted lease is cancelled "with a last_error saying so";
# the wording is the implementation's.
EXHAUSTED = "<lease expired on the last attempt>"


def lease_of(lease: float | timedelta | None) -> timedelta:
    if lease is None:
        return timedelta(seconds=DEFAULT_LEASE)
    return lease if isinstance(lease, timedelta) else timedelta(seconds=lease)


def error_text(cause: object) -> str:
    return "" if cause is None else str(cause)


class QueueModel:
    """SPEC §3 in plain Python: what each manager method returns and leaves behind."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.max_attempts: int | None = None

    def ordered(self) -> list[Row]:
        return sorted(self.rows.values(), key=Row.order)

    def enqueue(self, item: dict[str, Any], now: datetime) -> str:
        id = item.get("id") or intent_id(item["kind"], item["event_id"], item["target"])
        self.rows.setdefault(
            id,
            Row(
                id=id,
                kind=item["kind"],
                event_id=item["event_id"],
                target=item["target"],
                payload=copy.deepcopy(item.get("payload")),
                state="pending",
                attempts=0,
                next_at=item.get("next_at") or now,
                created_at=now,
                updated_at=now,
                last_error="",
                claim_token="",
                claim_until=None,
            ),
        )
        return id

    def claim_many(
        self, limit: int, now: datetime, lease: Any, kinds: Collection[str] | None
    ) -> list[Row]:
        """Claim in the model; the caller copies in the tokens the database chose."""
        if kinds is not None and not kinds:
            return []
        rows = [r for r in self.ordered() if kinds is None or r.kind in kinds]

        def expired(row: Row) -> bool:
            return row.state == "running" and row.claim_until is not None and row.claim_until <= now

        if self.max_attempts is not None:
            for row in rows:
                if expired(row) and row.attempts >= self.max_attempts:
                    row.move_to("cancelled", now)
                    row.last_error = EXHAUSTED
        due = [r for r in rows if (r.state == "pending" and r.next_at <= now) or expired(r)]
        for row in due[:limit]:
            row.state, row.attempts, row.updated_at = "running", row.attempts + 1, now
            row.claim_until = now + lease_of(lease)
        return due[:limit]

    def held(self, id: str, token: str) -> Row | None:
        row = self.rows.get(id)
        if row is not None and row.state == "running" and row.claim_token == token:
            return row
        return None

    def renew(self, id: str, token: str, *, now: datetime, lease: Any) -> bool:
        if row := self.held(id, token):
            row.claim_until, row.updated_at = now + lease_of(lease), now
        return row is not None

    def complete(self, id: str, token: str, *, now: datetime) -> bool:
        if row := self.held(id, token):
            row.move_to("completed", now)
        return row is not None

    def retry(self, id: str, token: str, cause: object, *, now: datetime) -> bool:
        if row := self.held(id, token):
            if self.max_attempts is not None and row.attempts >= self.max_attempts:
                row.move_to("cancelled", now)
            else:
                row.move_to("pending", now)
                row.next_at = now + backoff(id, row.attempts)
            row.last_error = error_text(cause)
        return row is not None

    def cancel_claim(self, id: str, token: str, cause: object, *, now: datetime) -> bool:
        if row := self.held(id, token):
            row.move_to("cancelled", now)
            row.last_error = error_text(cause)
        return row is not None

    def release(self, id: str, token: str, *, now: datetime) -> bool:
        if row := self.held(id, token):
            row.move_to("pending", now)
            row.next_at = now
        return row is not None

    def complete_pending(self, id: str, *, now: datetime) -> bool:
        row = self.rows.get(id)
        if row is None or row.state != "pending":
            return False
        row.move_to("completed", now)
        return True

    def retry_now(self, id: str, *, now: datetime) -> bool:
        row = self.rows.get(id)
        if row is None or row.state not in Intent.ACTIVE_STATES:
            return False
        row.move_to("pending", now)
        row.next_at = now
        return True

    def cancel(self, id: str, *, now: datetime) -> bool:
        row = self.rows.get(id)
        if row is None or row.state not in Intent.ACTIVE_STATES:
            return False
        row.move_to("cancelled", now)
        return True

    def pending(self, kind: str | None) -> list[str]:
        return [
            r.id
            for r in self.ordered()
            if r.state in Intent.ACTIVE_STATES and (kind is None or r.kind == kind)
        ]

    def in_state(self, state: str | None) -> list[str]:
        return [r.id for r in self.ordered() if state is None or r.state == state]


@dataclass(frozen=True)
class Claim:
    worker: str
    id: str
    token: str


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Intent.objects.all().delete()
        self.model = QueueModel()
        self.clock = T0
        self.claims: list[Claim] = []
        self.override: override_settings | None = None
        self.seen: dict[str, tuple[Any, ...]] = {}

    def teardown(self) -> None:
        if self.override is not None:
            self.override.disable()

    # -- drawing arguments -------------------------------------------------------

    def draw_item(self, data: st.DataObject) -> dict[str, Any]:
        """An enqueue item; few distinct triples, so duplicates are common."""
        item: dict[str, Any] = {
            "kind": data.draw(st.sampled_from(KINDS)),
            "event_id": data.draw(st.sampled_from(["e1", "e2", "e3"])),
            "target": data.draw(st.sampled_from(["https://a.example/h", "device:7"])),
        }
        if data.draw(st.booleans()):
            item["payload"] = data.draw(payloads)
        if data.draw(st.integers(0, 2)) == 0:
            item["next_at"] = self.clock + timedelta(seconds=data.draw(st.integers(-60, 60)))
        if data.draw(st.integers(0, 5)) == 0:
            item["id"] = data.draw(st.sampled_from(["c0ffee", "c0ffee01", "0ddba11"]))
        return item

    def draw_claim(self, data: st.DataObject) -> Claim:
        """A claim to act on: one still held, a stale one, or a token never issued."""
        latest = self.claims[::-1]
        held = [c for c in latest if self.model.held(c.id, c.token)]
        stale = [c for c in latest if c not in held]
        worker = data.draw(st.sampled_from(WORKERS))
        forged = [Claim(worker, UNKNOWN_ID, FORGED_TOKEN)]
        forged += [
            Claim(worker, id, t) for id in sorted(self.model.rows)[:2] for t in (FORGED_TOKEN, "")
        ]
        pool = data.draw(st.sampled_from([p for p in (held, held, stale, forged) if p]))
        return data.draw(st.sampled_from(pool))

    def draw_instant(self, data: st.DataObject) -> datetime:
        """The clock, or exactly (or 1 µs before) a future next_at or lease end.

        Those instants are where ``<=`` and ``<`` differ, so the machine visits
        them on purpose instead of hoping a random step lands there.
        """
        rows = self.model.rows.values()
        instants = {r.next_at for r in rows if r.state == "pending"}
        instants |= {r.claim_until for r in rows if r.claim_until is not None}
        future = sorted(t for t in instants if t > self.clock)
        if not future or not data.draw(st.booleans()):
            return self.clock
        nudge = data.draw(st.sampled_from([timedelta(0), -timedelta(microseconds=1)]))
        return max(self.clock, data.draw(st.sampled_from(future)) + nudge)

    # -- rules -------------------------------------------------------------------------
    # One rule per actor; each draws its action. Hypothesis favours the rules that
    # sort first (by name, among rules with the same arguments) and the first
    # choice of a list, so the claimant comes first, the first choices move an
    # intent forward, and the actions that matter most are listed twice.

    @initialize(data=st.data(), max_attempts=st.sampled_from([None, None, 1, 2]))
    def start(self, data: st.DataObject, max_attempts: int | None) -> None:
        assert not Intent.objects.exists()
        self.configure(max_attempts)
        self.enqueue_many(data, size=st.integers(3, 8))

    @rule(data=st.data())
    def claimant(self, data: st.DataObject) -> None:
        """A worker claims, or acts on one of its claims (fresh or stale)."""
        actions = ["retry", "claim", "complete", "claim", "renew", "cancel_claim", "release"]
        action = data.draw(st.sampled_from(actions)) if self.claims else "claim"
        if action == "claim":
            self.claim(data)
        else:
            options = {"renew": {"lease": leases}, "retry": {"cause": causes}}
            options["cancel_claim"] = options["retry"]
            drawn = {k: data.draw(v) for k, v in options.get(action, {}).items()}
            claim = self.draw_claim(data)
            expected = getattr(self.model, action)(claim.id, claim.token, now=self.clock, **drawn)
            got = getattr(Intent.objects, action)(claim.id, claim.token, now=self.clock, **drawn)
            assert got is expected, f"{action}: returned {got}, model says {expected}"

    @rule(data=st.data())
    def clock(self, data: st.DataObject) -> None:
        """Time passes (often exactly to a deadline), or MAX_ATTEMPTS changes."""
        action = data.draw(st.sampled_from(["advance", "advance", "advance", "max_attempts"]))
        if action == "max_attempts":
            self.configure(data.draw(st.sampled_from([None, 1, 2, 3])))
        elif data.draw(st.booleans()):
            self.clock = self.draw_instant(data)
        else:
            self.clock += timedelta(seconds=data.draw(steps))

    @rule(data=st.data())
    def operator(self, data: st.DataObject) -> None:
        """An administrator retries or cancels an intent, or lists the queue."""
        action = data.draw(st.sampled_from(["read", "retry_now", "cancel"]))
        if action == "read":
            kind = data.draw(st.sampled_from([None, *KINDS]))
            state = data.draw(st.sampled_from([None, *Intent.State]))
            pending = list(Intent.objects.pending(kind).values_list("id", flat=True))
            assert pending == self.model.pending(kind)
            in_state = list(Intent.objects.in_state(state).values_list("id", flat=True))
            assert in_state == self.model.in_state(state)
        else:
            self.by_id(data, action)

    @rule(data=st.data())
    def producer(self, data: st.DataObject) -> None:
        """Application code enqueues, or completes a pending intent inline."""
        action = data.draw(st.sampled_from(["enqueue", "enqueue", "enqueue_many", "inline"]))
        if action == "enqueue":
            item = self.draw_item(data)
            expected = self.model.enqueue(item, self.clock)
            args = (item["kind"], item["event_id"], item["target"], item.get("payload"))
            options = {k: item[k] for k in ("next_at", "id") if k in item}
            assert Intent.objects.enqueue(*args, **options, now=self.clock) == expected
        elif action == "enqueue_many":
            self.enqueue_many(data, size=st.integers(0, 6))
        else:
            self.by_id(data, "complete_pending")

    # -- actions -----------------------------------------------------------------------

    def configure(self, max_attempts: int | None) -> None:
        if self.override is not None:
            self.override.disable()
        self.override = override_settings(
            INTENTS=intents(LEASE=DEFAULT_LEASE, MAX_ATTEMPTS=max_attempts)
        )
        self.override.enable()
        self.model.max_attempts = max_attempts

    def enqueue_many(self, data: st.DataObject, size: st.SearchStrategy[int]) -> None:
        items = [self.draw_item(data) for _ in range(data.draw(size))]
        expected = [self.model.enqueue(item, self.clock) for item in items]
        assert Intent.objects.enqueue_many(items, now=self.clock) == expected

    def claim(self, data: st.DataObject) -> None:
        """``claim`` or ``claim_many``, now or exactly at a deadline."""
        worker = data.draw(st.sampled_from(WORKERS))
        limit = data.draw(st.none() | st.integers(1, 4))
        lease, kinds = data.draw(leases), data.draw(kind_filters)
        self.clock = self.draw_instant(data)
        expected = self.model.claim_many(limit or 1, self.clock, lease, kinds)
        if limit is None:
            one = Intent.objects.claim(now=self.clock, lease=lease, kinds=kinds)
            got = [] if one is None else [one]
        else:
            got = Intent.objects.claim_many(limit, now=self.clock, lease=lease, kinds=kinds)
        assert [i.id for i in got] == [r.id for r in expected], "claimed other intents"
        issued = {c.token for c in self.claims}
        for row, intent in zip(expected, got, strict=True):
            token = intent.claim_token
            assert len(token) == 32 and set(token) <= HEX_DIGITS, token
            assert token not in issued, "a claim token was issued twice"
            row.claim_token = token
            self.claims.append(Claim(worker, row.id, token))
            assert_matches(intent, row)

    def by_id(self, data: st.DataObject, method: str) -> None:
        """``complete_pending``, ``retry_now`` or ``cancel``, mostly on unfinished intents.

        The intents changed last come first: they are the ones with a history.
        """
        latest = sorted(self.model.rows.values(), key=lambda r: r.updated_at, reverse=True)
        active = [r.id for r in latest if r.state in Intent.ACTIVE_STATES]
        anything = [*sorted(self.model.rows), UNKNOWN_ID]
        pool = data.draw(st.sampled_from([p for p in (active, active, anything) if p]))
        id = data.draw(st.sampled_from(pool))
        expected = getattr(self.model, method)(id, now=self.clock)
        got = getattr(Intent.objects, method)(id, now=self.clock)
        assert got is expected, f"{method}: returned {got}, model says {expected}"

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def rows_only_move_forward_and_match_the_model(self) -> None:
        stored = {intent.id: intent for intent in Intent.objects.in_state()}
        for id, intent in stored.items():
            claimed = bool(intent.claim_token) and intent.claim_until is not None
            assert (intent.state == "running") is claimed, f"{id[:12]}: running iff claimed"
            assert intent.state != "running" or intent.attempts >= 1
            if (before := self.seen.get(id)) is not None:
                assert intent.attempts >= before[ATTEMPTS], f"{id[:12]}: attempts decreased"
                if before[STATE] in Intent.TERMINAL_STATES:
                    assert columns(intent) == before, f"{id[:12]}: a finished intent changed"
        assert set(self.seen) <= set(stored), "an intent disappeared"
        self.seen = {id: columns(intent) for id, intent in stored.items()}
        assert list(stored) == [row.id for row in self.model.ordered()], "claim order differs"
        for intent in stored.values():
            assert_matches(intent, self.model.rows[intent.id])


def columns(intent: Intent) -> tuple[Any, ...]:
    return tuple(getattr(intent, name) for name in COLUMNS)


def assert_matches(intent: Intent, row: Row) -> None:
    for name in COLUMNS:
        want, got = getattr(row, name), getattr(intent, name)
        if name == "last_error" and want == EXHAUSTED:
            assert "lease expired" in got and "MAX_ATTEMPTS" in got, got
        else:
            assert got == want, f"{row.id[:12]}.{name}: stored {got!r}, model says {want!r}"


@pytest.mark.django_db(transaction=True)
def test_the_queue_behaves_like_its_model() -> None:
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
