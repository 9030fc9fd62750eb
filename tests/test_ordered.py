"""``"ordered": True`` (SPEC §14) in one process, time driven by ``now=``.

An intent of an ordered kind is claimed only when no intent of its kind and
target created before it is pending or running: each target's intents start
one at a time, oldest first, whatever their priority, and a failing or
snoozed head holds only its own target. The claim is ``store/limited.py``'s
on every database; real worker processes are in ``test_ordered_process.py``.
Every test checks the rows afterwards: what waits stays pending, untouched.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_intents.conf import parse
from django_intents.models import Intent
from django_intents.rules.limits import heads, limited_kinds, ordered_kinds
from django_intents.rules.targets import TargetPolicy
from django_intents.store import backend_for
from django_intents.store.statements import bind

from .conftest import at, external_kinds, intents

pytestmark = pytest.mark.django_db(transaction=True)

HOOK, FREE = "o.hook", "o.free"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds(HOOK, FREE):
        yield


def ordered(**more: Any) -> Any:
    """``INTENTS`` with the hook kind ordered (and ``more`` in its LIMITS entry)."""
    declared = [*intents().get("EXTERNAL_KINDS", ()), HOOK, FREE]
    entry = {"ordered": True, **more}
    return override_settings(INTENTS=intents(EXTERNAL_KINDS=declared, LIMITS={HOOK: entry}))


def enqueue(targets: list[str], kind: str = HOOK, start: float = 0.0, **kw: Any) -> list[str]:
    """One intent per entry of ``targets``, created (and due) one second apart, in order."""
    return [
        Intent.objects.enqueue(kind, f"{kind}-{start + i}", target, now=at(start + i), **kw)
        for i, target in enumerate(targets)
    ]


def claim(n: int = 10, now: float = 100.0, **kw: Any) -> list[str]:
    """Claim with a long lease: a test's clock jumps, and no lease should run out by it."""
    kw.setdefault("lease", 10_000)
    return [i.id for i in Intent.objects.claim_many(n, now=at(now), **kw)]


def states(ids: list[str]) -> list[tuple[str, int]]:
    """Each intent's state and attempts, in the order of ``ids``."""
    rows = {r.id: (r.state, r.attempts) for r in Intent.objects.filter(id__in=ids)}
    return [rows[id] for id in ids]


def finish(id: str, now: float) -> None:  # noqa: A002
    token = Intent.objects.get(id=id).claim_token
    assert Intent.objects.complete(id, token, now=at(now))


# -- the rule ----------------------------------------------------------------------


def test_the_setting_makes_a_kind_ordered_and_limited_without_caps():
    built, errors = parse({"LIMITS": {HOOK: {"ordered": True}, FREE: {"ordered": False}}})
    assert errors == []
    assert built.limits == {}
    assert ordered_kinds(built.targets, None) == [HOOK]
    assert ordered_kinds(built.targets, [FREE]) == []
    assert limited_kinds(built.limits, built.targets) == {HOOK}


def test_a_bad_ordered_value_is_an_error_naming_the_key():
    _, errors = parse({"LIMITS": {HOOK: {"ordered": "yes"}}})
    assert len(errors) == 1
    assert "['ordered'] must be True or False, not 'yes'" in str(errors[0])


def test_only_its_targets_head_of_an_ordered_kind_may_start():
    class Row:
        def __init__(self, id: str, kind: str, target: str) -> None:  # noqa: A002
            self.id, self.kind, self.target = id, kind, target

    rows = [Row("b", HOOK, "x"), Row("a", HOOK, "x"), Row("c", HOOK, "y"), Row("f", FREE, "x")]
    head_of = {(HOOK, "x"): "a", (HOOK, "y"): "older-than-c"}
    free, behind = heads(rows, {HOOK}, head_of)  # type: ignore[arg-type]
    assert [r.id for r in free] == ["a", "f"]
    assert behind == {"b", "c"}
    assert TargetPolicy(ordered=True).ordered


# -- the claim ---------------------------------------------------------------------


def test_a_target_starts_one_at_a_time_in_creation_order():
    ids = enqueue(["x", "x", "x", "y", "y"])
    with ordered():
        assert claim() == [ids[0], ids[3]]
        assert claim() == []  # both heads run
        finish(ids[0], 101)
        assert claim(now=102) == [ids[1]]
        finish(ids[3], 103)
        finish(ids[1], 104)
        assert claim(now=105) == [ids[2], ids[4]]
    assert states(ids) == [("completed", 1)] * 2 + [("running", 1)] + [("completed", 1)] + [
        ("running", 1)
    ]


def test_creation_order_not_due_order_decides():
    """An older intent due later holds the younger ones of its target."""
    older = Intent.objects.enqueue(HOOK, "late", "x", now=at(0), next_at=at(200))
    younger = enqueue(["x", "y"], start=1)
    with ordered():
        assert claim(now=100) == [younger[1]]
        assert claim(now=201) == [older]
    assert states([older, *younger]) == [("running", 1), ("pending", 0), ("running", 1)]


def test_a_failing_head_holds_only_its_target_and_retries_first():
    ids = enqueue(["x", "x", "y", "y"])
    with ordered():
        assert claim() == [ids[0], ids[2]]
        head = Intent.objects.get(id=ids[0])
        # Backoff: the head is due again at 150, its target waits until then.
        assert Intent.objects.retry(head.id, head.claim_token, "HTTP 500", now=at(101))
        Intent.objects.filter(id=head.id).update(next_at=at(150))
        finish(ids[2], 102)
        assert claim(now=103) == [ids[3]]
        assert claim(now=149) == []
        assert claim(now=150) == [ids[0]]
    after = Intent.objects.get(id=ids[0])
    assert (after.state, after.attempts, after.last_error) == ("running", 2, "HTTP 500")
    assert states(ids[1:]) == [("pending", 0), ("completed", 1), ("running", 1)]


def test_a_snoozed_head_still_holds_its_target():
    ids = enqueue(["x", "x", "y"])
    with ordered():
        assert claim() == [ids[0], ids[2]]
        head = Intent.objects.get(id=ids[0])
        moved = _snooze(head, at(300))
        assert moved == ids[0]
        assert claim(now=200) == []
        assert claim(now=300) == [ids[0]]
    assert states(ids) == [("running", 2), ("pending", 0), ("running", 1)]
    assert Intent.objects.get(id=ids[0]).snoozes == 1


def _snooze(intent: Intent, until: Any) -> str:
    from django_intents.store.endings import Ending

    [moved] = Intent.objects.finish_many(
        [
            Ending(
                id=intent.id,
                token=intent.claim_token,
                state="pending",
                next_at=until,
                error="429",
                snooze=True,
            )
        ],
        now=at(101),
    )
    return moved


def test_completing_or_cancelling_the_head_releases_the_next():
    ids = enqueue(["x", "x", "x"])
    with ordered():
        assert claim() == [ids[0]]
        head = Intent.objects.get(id=ids[0])
        assert Intent.objects.cancel_claim(head.id, head.claim_token, "gave up", now=at(101))
        assert claim(now=102) == [ids[1]]
        assert Intent.objects.cancel(ids[2], now=at(103))  # a pending one, by hand
        finish(ids[1], 104)
        assert claim(now=105) == []
    assert states(ids) == [("cancelled", 1), ("completed", 1), ("cancelled", 0)]


def test_cancelling_a_pending_head_releases_the_one_behind_it():
    older = Intent.objects.enqueue(HOOK, "late", "x", now=at(0), next_at=at(500))
    [younger] = enqueue(["x"], start=1)
    with ordered():
        assert claim() == []
        assert Intent.objects.cancel(older, now=at(101))
        assert claim(now=102) == [younger]
    assert states([older, younger]) == [("cancelled", 0), ("running", 1)]


def test_priority_does_not_reorder_a_target_but_still_orders_targets():
    low = enqueue(["x", "y"])
    urgent = enqueue(["x", "z"], start=10, priority=50)
    with ordered():
        # The urgent x waits for the older x; the urgent z goes first.
        assert claim(2) == [urgent[1], low[0]]
        finish(low[0], 101)
        assert claim(1, now=102) == [urgent[0]]
        assert claim(now=103) == [low[1]]
    assert states([*low, *urgent]) == [
        ("completed", 1),
        ("running", 1),
        ("running", 1),
        ("running", 1),
    ]


def test_a_target_of_2048_many_byte_characters_is_ordered_too():
    """Longer than a B-tree entry on PostgreSQL and a key on MySQL: the index keys its hash."""
    target = "é" * 2048
    ids = enqueue([target, target, "short"])
    with ordered():
        assert claim() == [ids[0], ids[2]]
        finish(ids[0], 101)
        assert claim(now=102) == [ids[1]]
    assert states(ids) == [("completed", 1), ("running", 1), ("running", 1)]


def test_an_expired_head_is_taken_over_and_still_holds_the_rest():
    ids = enqueue(["x", "x"])
    with ordered():
        assert [i.id for i in Intent.objects.claim_many(5, now=at(100), lease=10)] == [ids[0]]
        assert claim(now=109) == []
        assert claim(now=111) == [ids[0]]  # the lease ran out: the head again, not the next
    assert states(ids) == [("running", 2), ("pending", 0)]


def test_held_targets_at_the_front_do_not_hide_the_others():
    """Many due intents behind not-yet-due heads fill more than a scan: the claim
    scans again without those targets."""
    heads_ = [
        Intent.objects.enqueue(HOOK, f"head-{t}", f"held-{t}", now=at(0), next_at=at(900))
        for t in range(3)
    ]
    held = enqueue([f"held-{i % 3}" for i in range(40)], start=1)
    free = enqueue(["free-a", "free-b"], start=100)
    with ordered():
        assert claim(2, now=200) == free
    assert Counter(states(held)) == {("pending", 0): 40}
    assert Counter(states(heads_)) == {("pending", 0): 3}


def test_ordered_composes_with_per_target_and_running():
    ids = enqueue(["x", "x", "y", "y", "z", "z"])
    with ordered(per_target=5, running=2):
        assert claim() == [ids[0], ids[2]]  # one per target, two of the kind
        finish(ids[0], 101)
        assert claim(now=102) == [ids[1]]  # x's next, not z's head: y and x fill the kind
        finish(ids[1], 103)
        assert claim(now=104) == [ids[4]]
    assert states(ids) == [
        ("completed", 1),
        ("completed", 1),
        ("running", 1),
        ("pending", 0),
        ("running", 1),
        ("pending", 0),
    ]


def test_a_paused_ordered_kind_is_not_claimed_and_holds_its_place():
    ids = enqueue(["x", "x"])
    free = enqueue(["x"], kind=FREE, start=5)
    with ordered():
        Intent.objects.pause(HOOK, now=at(50))
        assert claim() == free
        Intent.objects.resume(HOOK)
        assert claim(now=101) == [ids[0]]
    assert states(ids) == [("running", 1), ("pending", 0)]


def test_unordered_kinds_in_the_same_claim_are_not_held():
    hooks = enqueue(["x", "x"])
    free = enqueue(["x", "x"], kind=FREE, start=10)
    with ordered():
        assert claim() == [hooks[0], *free]
    assert states(hooks) == [("running", 1), ("pending", 0)]


def test_a_claim_of_one_intent_takes_the_head():
    ids = enqueue(["x", "x"])
    with ordered():
        first = Intent.objects.claim(now=at(100))
        assert first is not None and first.id == ids[0]
        assert Intent.objects.claim(now=at(100)) is None
    assert states(ids) == [("running", 1), ("pending", 0)]


def test_paced_caps_the_ordered_heads_of_one_claim_and_not_the_other_kinds():
    """What a pool asks whose other kinds queue ahead (``Demand.paced``): a head that
    waited in its queue would hold its whole target."""
    hooks = enqueue(["a", "b", "c", "a"])
    free = enqueue(["x", "x"], kind=FREE, start=10)
    with ordered():
        assert claim(10, 100, paced=1) == [hooks[0], *free]
        held = Intent.objects.claim_many(10, now=at(101), paced=0)
        assert (list(held), held.held_back) == ([], True)
        assert states(hooks) == [("running", 1), ("pending", 0), ("pending", 0), ("pending", 0)]
        assert claim(10, 102, paced=5) == hooks[1:3]  # the heads of b and c; a's runs
    assert states(hooks[1:]) == [("running", 1), ("running", 1), ("pending", 0)]


def test_concurrent_claimers_never_run_two_of_a_target(vendor):
    targets = [f"t{i % 4}" for i in range(24)]
    ids = enqueue(targets)
    order = {t: [id for id, tt in zip(ids, targets, strict=True) if tt == t] for t in set(targets)}
    started: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer() -> None:
        try:
            for n in range(40):
                # A long lease: a claimer that runs ahead through empty rounds must
                # not find a slower one's lease run out and take its intent over.
                got = Intent.objects.claim_many(3, now=at(100 + n), lease=3600)
                with lock:
                    running = Counter(
                        Intent.objects.filter(state="running").values_list("target", flat=True)
                    )
                    assert max(running.values(), default=0) <= 1, running
                    started.extend(i.id for i in got)
                for intent in got:
                    assert Intent.objects.complete(intent.id, intent.claim_token, now=at(100 + n))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    with ordered():
        threads = [threading.Thread(target=claimer) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    assert sorted(started) == sorted(ids)
    for target, wanted in order.items():
        assert [id for id in started if id in wanted] == wanted, target
    assert Counter(states(ids)) == {("completed", 1): 24}


def test_a_head_due_after_the_intents_behind_it_is_found_past_a_full_scan():
    """The scan reads a few times the claim's size in due order; a head retried
    later sorts after all of its target's backlog, and is read by its key."""
    ids = enqueue(["x", "y"] + ["x", "y"] * 20, start=0)
    Intent.objects.filter(id__in=ids[:2]).update(next_at=at(90))
    with ordered():
        assert claim(2, now=100) == ids[:2]
    assert Counter(states(ids[2:])) == {("pending", 0): 40}


def test_the_head_lookup_is_one_walk_of_the_ordered_index_per_target(vendor):
    """Migration 0015's index answers ``ordered_heads`` on every database."""
    backend = backend_for(connection, Intent)
    ids = enqueue(["x", "x", "y"])
    # A table the planner would not read whole: many kinds and targets.
    Intent.objects.enqueue_many(
        {"kind": FREE if n % 2 else HOOK, "event_id": f"bulk-{n}", "target": f"t{n % 300}"}
        for n in range(3000)
    )
    pairs = [(HOOK, "x"), (HOOK, "y"), (HOOK, "nothing")]
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(f"ANALYZE {Intent._meta.db_table}")
        assert backend.ordered_heads(cursor, pairs) == {(HOOK, "x"): ids[0], (HOOK, "y"): ids[2]}
    if vendor == "postgresql":
        params: dict[str, Any] = {"kinds": [k for k, _ in pairs], "targets": [t for _, t in pairs]}
    else:
        params = {"pairs": [backend.head_params(*pair) for pair in pairs]}
    statement, values = bind(backend.sql.ordered_heads, params)
    explain = "EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN "
    with connection.cursor() as cursor:
        cursor.execute(explain + statement, values)
        lines = [" ".join(str(cell) for cell in line) for line in cursor.fetchall()]
    plan = "\n".join(lines)
    assert "intents_ordered" in plan, plan
    # No sort of a target's backlog: only MySQL's two rows per target, one per state, are.
    on_table = [line for line in lines if "intent" in line and "derived" not in line]
    assert not [line for line in on_table if "TEMP B-TREE" in line or "filesort" in line], plan
