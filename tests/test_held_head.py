"""A limited claim walks past the held-back head once, not on every claim (``heldhead.py``).

A dead partner's intents stay pending at the head of the queue while its
places are taken. PostgreSQL's exact claim of priority 0 remembers the head it
stepped over (in the pool's ``ClaimMemory``) and starts past it while the
head's targets stay full. What
every database must show is the same claims as before: a target that frees a
place gets its oldest intent, and the full claim finds what lands below the
head. PostgreSQL's tests show the rows the walk no longer reads, and that the
claims with the remembered head are the claims without it.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import pytest
from django.db import connection, transaction

from django_intents.models import Intent
from django_intents.rules.limits import Limit
from django_intents.store import backend_for
from django_intents.store.claims import ClaimFilters
from django_intents.store.memory import ClaimMemory
from django_intents.store.postgresql.heldhead import MAX_LEVELS, Level, advanced

from .conftest import at
from .test_limits import FREE, HOOK, enqueue, kinds, limits  # noqa: F401 - an autouse fixture

pytestmark = pytest.mark.django_db(transaction=True)

KEY = ("limited", HOOK)
FLOOR = at(-1)
DEAD = "https://dead.example/"
MEMORY = ClaimMemory()  # the claims' memory, as one pool's; each test starts from nothing


@pytest.fixture(autouse=True)
def memory() -> Iterator[ClaimMemory]:
    global MEMORY
    MEMORY = ClaimMemory()
    yield MEMORY


@pytest.fixture
def capped() -> Iterator[None]:
    with limits(per_target=2):
        yield


def backend() -> object:
    return backend_for(connection, Intent)


def exact() -> None:
    """Make PostgreSQL's next claim its exact one, of priority 0 alone, as a
    pool's claims are once a target is at its cap and nothing else is due
    (the other databases' claims ignore the memory)."""
    MEMORY.tight[KEY] = time.monotonic() + 60
    MEMORY.others_due[KEY] = False


def claim(n: int, now: float, *, since: datetime | None = FLOOR) -> list[Intent]:
    exact()
    return list(
        Intent.objects.claim_many(
            n, now=at(now), kinds=[HOOK], since=since, lease=600, memory=MEMORY
        )
    )


def dead_backlog() -> tuple[list[str], list[str]]:
    """The dead partner's 12 intents first (two of them claimed: its places
    taken), then 30 of three live partners behind them."""
    dead = enqueue([DEAD] * 12)
    live = enqueue([f"https://p{i % 3}.example/" for i in range(30)], start=20)
    assert {i.id for i in claim(2, 60, since=None)} == set(dead[:2])
    full_claim(60.5)
    return dead, live


def full_claim(now: float) -> None:
    """A pool's full claim, once a second, which finds the held-back head: rolled
    back, so that only what the claims' memory learnt from it stays."""
    with transaction.atomic():
        claim(1, now, since=None)
        transaction.set_rollback(True)


def stack() -> list[Level]:
    """The head the claims of the hook kind remember (one pool's, one entry)."""
    [levels] = [v for k, v in MEMORY.held_heads.items() if k[1] == (HOOK,)] or [[]]
    return levels


def pending_of(target: str) -> int:
    return Intent.objects.filter(state="pending", target=target).count()


# -- every database: the claims are the claims -----------------------------------


def test_claims_past_a_full_targets_backlog_take_the_live_partners_in_order(capped):
    dead, live = dead_backlog()
    taken = [i.id for n in range(6) for i in claim(2, 61 + n)]
    # Two places per live partner: p0, p1, p2 twice each, in claim order.
    assert taken == live[:6]
    assert pending_of(DEAD) == 10
    assert Counter(Intent.objects.values_list("state", flat=True)) == {"running": 8, "pending": 34}


def test_a_full_target_that_frees_a_place_gets_its_oldest_intent_next(capped):
    dead, live = dead_backlog()
    for n in range(3):
        claim(1, 61 + n)
    gone = Intent.objects.get(id=dead[0])
    assert Intent.objects.complete(gone.id, gone.claim_token, now=at(70))
    [first] = claim(1, 71)
    assert first.id == dead[2]  # the oldest the dead partner has pending
    assert pending_of(DEAD) == 9
    assert Intent.objects.get(id=dead[1]).state == "running"


def test_an_intent_written_below_the_held_head_is_taken_by_the_full_claim(capped):
    dead, live = dead_backlog()
    for n in range(3):
        claim(1, 61 + n)
    # Written with a next_at among the dead partner's, after the claims passed them.
    late = Intent.objects.enqueue(HOOK, "late", "https://p9.example/", next_at=at(5), now=at(64))
    [first] = claim(1, 65, since=None)
    assert first.id == late
    assert Intent.objects.get(id=late).state == "running"
    assert pending_of(DEAD) == 10


def test_a_kind_at_its_running_cap_holds_everything_and_frees_in_order():
    enqueue([DEAD] * 4)
    live = enqueue(["https://p0.example/"] * 4, start=20)
    with limits(running=2):
        claim(2, 60, since=None)
        assert claim(2, 61) == []
        assert claim(2, 62) == []
        first = Intent.objects.filter(state="running").first()
        assert Intent.objects.complete(first.id, first.claim_token, now=at(63))
        [next_one] = claim(2, 64)
    assert next_one.target == DEAD  # the kind's oldest pending, not the live partner's
    assert Intent.objects.get(id=live[0]).state == "pending"
    assert Counter(Intent.objects.values_list("state", flat=True)) == {
        "running": 2,
        "pending": 5,
        "completed": 1,
    }


# -- PostgreSQL: what the walk reads, and the same claims with and without the head --


def postgresql_only(vendor: str) -> None:
    if vendor != "postgresql":
        pytest.skip("the remembered head is PostgreSQL's exact claim")


def rows_read_past(filters: ClaimFilters, now: float, memory: ClaimMemory | None = None) -> int:
    """The rows the claim's scans of the table read and dropped, from its own plan
    (with what ``memory``, by default the tests', remembers)."""
    b = backend()
    tail = {"salt": "salt", "until": b.dt(at(now + 600))}
    [(statement, params)] = b.candidate_queries(
        now=at(now), limit=2, filters=filters, zero=True, tail=tail, memory=memory or MEMORY
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def dropped(node: dict) -> int:
        own = node.get("Rows Removed by Filter", 0) if node.get("Index Name") else 0
        return own + sum(dropped(child) for child in node.get("Plans", ()))

    return dropped(plan[0]["Plan"])


def test_postgresql_reads_a_dead_partners_backlog_once_not_on_every_claim(capped, vendor):
    postgresql_only(vendor)
    dead, live = dead_backlog()
    filters = ClaimFilters(kinds=[HOOK], since=FLOOR, limits={HOOK: Limit(per_target=2)})
    # Nothing remembered: the walk reads them all.
    assert rows_read_past(filters, 61, ClaimMemory()) >= 10
    claim(1, 61)
    claim(1, 62)
    [level] = stack()
    assert (level.kind, level.target) == (HOOK, DEAD)
    # The walk starts where the last claim found its first live intent.
    assert level.key[2] == live[1]
    assert rows_read_past(filters, 63) <= 2
    assert pending_of(DEAD) == 10


def test_postgresql_drops_the_head_when_its_target_frees_a_place(capped, vendor):
    postgresql_only(vendor)
    dead, live = dead_backlog()
    claim(1, 61)
    claim(1, 62)
    assert stack()
    gone = Intent.objects.get(id=dead[1])
    assert Intent.objects.complete(gone.id, gone.claim_token, now=at(63))
    [first] = claim(1, 64)
    assert first.id == dead[2]
    assert stack() == []  # the claims above the floor now walk from it
    # Full again: the pool's next full claim finds the head anew.
    full_claim(65)
    assert [level.target for level in stack()] == [DEAD]


def test_postgresql_keeps_a_head_apart_for_each_set_of_kinds_claimed(capped, vendor):
    """The hook kind's claims walk past a free intent before their head; a claim
    of both kinds must not start at that head."""
    postgresql_only(vendor)
    free = Intent.objects.enqueue(FREE, "free", "https://p9.example/", now=at(5))
    dead, live = dead_backlog()
    claim(1, 61)
    claim(1, 62)
    assert stack()[0].key[2] == live[1]  # past the free intent at(5)
    exact()
    both = Intent.objects.claim_many(
        1, now=at(63), kinds=[HOOK, FREE], since=FLOOR, lease=600, memory=MEMORY
    )
    assert [i.id for i in both] == [free]
    assert pending_of(DEAD) == 10


def test_postgresql_a_full_claim_says_where_the_first_due_intent_is(capped, vendor):
    """So that the pool's floor rises to it (``ClaimFloor.claimed``), not to nothing:
    the first due intent, or a running one before it, whose lease may expire."""
    postgresql_only(vendor)
    dead, live = dead_backlog()
    exact()
    taken = Intent.objects.claim_many(1, now=at(61), kinds=[HOOK], lease=600, memory=MEMORY)
    assert [i.id for i in taken] == live[:1]
    # dead[0], running: should its lease expire, it is due again in its old place.
    assert taken.held_back and taken.oldest_due == at(0)
    exact()
    floored = Intent.objects.claim_many(
        1, now=at(62), kinds=[HOOK], since=FLOOR, lease=600, memory=MEMORY
    )
    assert floored.held_back and floored.oldest_due is None  # it did not look below the floor
    for intent in Intent.objects.filter(state="running"):
        assert Intent.objects.complete(intent.id, intent.claim_token, now=at(63))
    Intent.objects.filter(state="pending").delete()
    exact()
    nothing = Intent.objects.claim_many(1, now=at(64), kinds=[HOOK], lease=600, memory=MEMORY)
    assert list(nothing) == [] and nothing.oldest_due == at(64)


def test_postgresql_claims_the_same_with_and_without_the_remembered_head(vendor):
    """A random relay: partners go down and come back, intents arrive, finish
    and are cancelled. Before each claim, the same claim without the
    remembered head, rolled back, must take the same intents."""
    postgresql_only(vendor)
    chance = random.Random(15)
    targets = [f"https://p{i}.example/" for i in range(5)]
    clock = 0.0
    with limits(per_target=2, running=7):
        enqueue([chance.choice(targets) for _ in range(40)])
        for step in range(60):
            clock += 1
            roll = chance.random()
            if roll < 0.3:
                enqueue([chance.choice(targets) for _ in range(5)], start=100 + step * 10)
            elif roll < 0.7:
                running = list(Intent.objects.filter(state="running"))
                for done in chance.sample(running, k=min(len(running), chance.randint(0, 3))):
                    Intent.objects.complete(done.id, done.claim_token, now=at(clock))
            elif roll < 0.8:
                pending = list(Intent.objects.filter(state="pending").values_list("id", flat=True))
                if pending:
                    Intent.objects.cancel(chance.choice(pending), now=at(clock))
            clock += 1
            if step % 4 == 0:
                full_claim(clock)
            n = chance.randint(1, 4)
            remembered = dict(MEMORY.held_heads)
            with transaction.atomic():
                MEMORY.held_heads.clear()
                without = [i.id for i in claim(n, clock)]
                transaction.set_rollback(True)
            MEMORY.held_heads.clear()
            MEMORY.held_heads.update(remembered)
            with_head = [i.id for i in claim(n, clock)]
            assert with_head == without, f"step {step}: the remembered head changed the claim"
            assert len(stack()) <= MAX_LEVELS
    states = Counter(Intent.objects.values_list("state", flat=True))
    assert states["running"] <= 7 and sum(states.values()) >= 40


# -- the stack itself ----------------------------------------------------------------


def level(n: int, target: str) -> Level:
    return Level((at(n), at(n), f"id{n}"), HOOK, target)


def test_a_claims_answer_moves_the_top_level_and_pushes_a_full_target():
    stack = [level(1, "a"), level(2, "b")]
    head = (at(5), at(5), "id5", HOOK, "c")
    assert advanced(stack, (2, *head, False, None)) == [level(1, "a"), Level(head[:3], HOOK, "b")]
    assert advanced(stack, (2, *head, True, None)) == [
        level(1, "a"),
        Level(head[:3], HOOK, "b"),
        Level(head[:3], HOOK, "c"),
    ]
    # "b" has room again: the levels from it up are dropped.
    assert advanced(stack, (1, *head, True, None)) == [
        Level(head[:3], HOOK, "a"),
        Level(head[:3], HOOK, "c"),
    ]
    # Nothing due outside the stack's targets: its positions still hold.
    assert advanced(stack, (2, None, None, None, None, None, None, None)) == stack
    assert stack == [level(1, "a"), level(2, "b")]  # the answer is a new list


def test_a_stack_never_names_more_than_its_limit_of_targets():
    stack = [level(n, f"t{n}") for n in range(MAX_LEVELS)]
    head = (at(99), at(99), "id99", HOOK, "more")
    grown = advanced(stack, (MAX_LEVELS, *head, True, None))
    assert len(grown) == MAX_LEVELS
    assert grown[-1] == Level(head[:3], HOOK, f"t{MAX_LEVELS - 1}")
