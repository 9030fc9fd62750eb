"""The lease table's renewals: each due lease once, in the order they fall due.

The loop asks for the next renewal on every turn; these tests hold many
claims and step a fake monotonic clock through their renewals, with a
manager that records each renewal instead of writing it.
"""

from __future__ import annotations

import pytest

from django_intents.attempt import Attempt
from django_intents.models import Intent
from django_intents.worker import leases
from django_intents.worker.execution import Claim

LEASE, RENEW = 30.0, 10.0


class Renewals:
    """A manager that accepts every renewal, or refuses and fails the ones named."""

    def __init__(self) -> None:
        self.renewed: list[str] = []
        self.refuse: set[str] = set()
        self.fail: set[str] = set()

    def renew(self, id: str, token: str, *, lease: float) -> bool:
        if id in self.fail:
            raise ConnectionError(f"renewal of {id} failed (test)")
        self.renewed.append(id)
        return id not in self.refuse


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(leases.time, "monotonic", lambda: now[0])
    return now


def claim(n: int) -> Claim:
    intent = Intent(id=f"intent-{n:03}", kind="test.ok", claim_token=f"token-{n:03}")
    return Claim(intent=intent, attempt=Attempt(intent), handler=lambda i, a: None)


def table(manager: Renewals) -> leases.LeaseTable:
    return leases.LeaseTable(manager, lease=LEASE, renew=RENEW, reached=lambda: None)  # type: ignore[arg-type]


def test_each_lease_is_renewed_once_when_due_in_the_order_they_were_sent(clock):
    manager = Renewals()
    held = table(manager)
    claims = [claim(n) for n in range(300)]
    for n, c in enumerate(claims):
        held.add(c, sent=1000.0 - n * 0.01)  # the later a claim, the earlier it was sent
    assert held.renew_due() == []
    assert manager.renewed == []
    assert held.next_renewal() == pytest.approx(1000.0 - 299 * 0.01 + RENEW)
    clock[0] = 1000.0 + RENEW - 1.5  # the 150 sent earliest are due
    assert held.renew_due() == []
    assert manager.renewed == [f"intent-{n:03}" for n in range(299, 149, -1)]
    assert held.renew_due() == []
    assert len(manager.renewed) == 150
    assert held.next_renewal() == pytest.approx(1000.0 - 149 * 0.01 + RENEW)


def test_a_dropped_claim_is_never_renewed(clock):
    manager = Renewals()
    held = table(manager)
    claims = [claim(n) for n in range(10)]
    for c in claims:
        held.add(c, sent=1000.0)
    for c in claims[:9]:
        held.drop(c)
    clock[0] = 1000.0 + RENEW
    assert held.renew_due() == []
    assert manager.renewed == ["intent-009"]
    assert len(held) == 1
    assert held.next_renewal() == 1000.0 + 2 * RENEW


def test_a_refused_renewal_is_returned_once_and_not_retried(clock):
    manager = Renewals()
    held = table(manager)
    first, second = claim(1), claim(2)
    held.add(first, sent=1000.0)
    held.add(second, sent=1000.0)
    manager.refuse.add("intent-001")
    clock[0] = 1000.0 + RENEW
    assert held.renew_due() == [first]
    assert held.renew_due() == []
    assert manager.renewed == ["intent-001", "intent-002"]
    assert held.next_renewal() == 1000.0 + 2 * RENEW  # the second's, not the refused one's


def test_a_renewal_that_fails_stays_due_for_the_next_turn(clock):
    manager = Renewals()
    held = table(manager)
    held.add(claim(1), sent=1000.0)
    manager.fail.add("intent-001")
    clock[0] = 1000.0 + RENEW
    with pytest.raises(ConnectionError):
        held.renew_due()
    assert held.next_renewal() == 1000.0 + RENEW
    manager.fail.clear()
    assert held.renew_due() == []
    assert manager.renewed == ["intent-001"]


def test_a_lease_that_ran_out_before_its_renewal_is_lost_not_renewed(clock):
    manager = Renewals()
    held = table(manager)
    late = claim(1)
    held.add(late, sent=1000.0)
    clock[0] = 1000.0 + LEASE
    assert held.renew_due() == []
    assert manager.renewed == []
    assert late.attempt.lost
    assert late.attempt.cancelled.is_set()
    assert held.next_renewal() == float("inf")


def test_claims_that_came_and_went_behind_a_long_held_one_leave_no_memory_behind(clock):
    manager = Renewals()
    held = table(manager)
    long_held = claim(0)
    held.add(long_held, sent=1000.0)
    for n in range(1, 5001):  # a busy pool: thousands claimed and finished in one renewal period
        brief = claim(n)
        held.add(brief, sent=1000.0 + n * 0.001)
        held.drop(brief)
    assert len(held) == 1
    assert len(held._renewals) <= 2 * 1 + 64 + 1
    clock[0] = 1000.0 + RENEW
    assert held.renew_due() == []
    assert manager.renewed == ["intent-000"]
    assert held.next_renewal() == 1000.0 + 2 * RENEW
