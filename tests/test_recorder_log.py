"""What the pool's recorder says about failures: a line each, or one line for a burst alike.

A partner outage fails every delivery to it with the same error; the log
must stay readable and cheap, while every failure is still recorded in its
row. The recorder here writes inline (``threaded=False``), so each
``record()`` is one batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.utils import timezone

from django_intents.attempt import Attempt
from django_intents.models import Intent
from django_intents.signals import Outcome
from django_intents.worker.execution import Claim
from django_intents.worker.recorder import BURST, Recorder

from .conftest import external_kinds

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with external_kinds("r.hook", "r.push"):
        yield


def failed_claims(kind: str, n: int, cause: str) -> list[Claim]:
    for i in range(n):
        Intent.objects.enqueue(kind, f"e{i}", "https://partner.example/hook")
    claimed = Intent.objects.claim_many(n, kinds=[kind])
    assert len(claimed) == n
    return [
        Claim(intent, Attempt(intent), handler=print, outcome=Outcome.ERROR, cause=cause)
        for intent in claimed
    ]


def record(claims: list[Claim], max_attempts: int | None = None) -> list[Outcome]:
    recorder = Recorder(Intent.objects, max_attempts=max_attempts, wake=lambda: None)
    for claim in claims:
        assert recorder.add(claim) is None
    return [outcome for _, outcome in recorder.record()]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_few_failures_are_logged_one_line_each(caplog):
    claims = failed_claims("r.hook", BURST, "PartnerDown: HTTP 503")
    with caplog.at_level(logging.WARNING, "django_intents.worker"):
        assert record(claims) == [Outcome.ERROR] * BURST
    lines = warnings(caplog)
    assert len(lines) == BURST
    assert all("(attempt 1): failed: PartnerDown: HTTP 503; retry in" in line for line in lines)
    rows = Intent.objects.filter(kind="r.hook")
    assert {(r.state, r.last_error) for r in rows} == {("pending", "PartnerDown: HTTP 503")}
    assert all(r.next_at > timezone.now() for r in rows)


def test_a_burst_failing_alike_is_one_line_that_counts_them_and_every_row_is_recorded(caplog):
    claims = failed_claims("r.hook", 40, "PartnerDown: HTTP 503")
    others = failed_claims("r.push", 2, "KeyError: 'token'")
    with caplog.at_level(logging.WARNING, "django_intents.worker"):
        assert record(claims + others) == [Outcome.ERROR] * 42
    lines = warnings(caplog)
    burst = [line for line in lines if "failed alike" in line]
    assert len(burst) == 1
    assert burst[0].startswith(
        "r.hook: 40 attempts failed alike: PartnerDown: HTTP 503; 40 retry in"
    )
    assert claims[0].intent.id[:12] in burst[0]
    assert len([line for line in lines if "r.push" in line and "KeyError" in line]) == 2
    assert len(lines) == 3
    assert set(Intent.objects.values_list("state", "attempts")) == {("pending", 1)}


def test_a_burst_that_exhausts_max_attempts_says_how_many_were_cancelled(caplog):
    claims = failed_claims("r.hook", 12, "PartnerDown: timeout")
    with caplog.at_level(logging.WARNING, "django_intents.worker"):
        record(claims, max_attempts=1)
    [line] = warnings(caplog)
    assert "12 attempts failed alike: PartnerDown: timeout; 12 cancelled, MAX_ATTEMPTS (1)" in line
    rows = Intent.objects.filter(kind="r.hook")
    assert {(r.state, r.last_error, r.claim_token) for r in rows} == {
        ("cancelled", "PartnerDown: timeout", "")
    }
