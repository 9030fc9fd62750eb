"""Concurrent claimers, each with its own connection, never share an intent."""

import threading
from collections import Counter

import pytest
from django.db import connections

from django_intents.models import Intent

from .conftest import T0, at

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
INTENTS = 1000


def claim_until_empty(limit: int, results: list, errors: list, start: threading.Barrier) -> None:
    try:
        start.wait()
        while True:
            batch = Intent.objects.claim_many(limit, now=at(1), lease=300)
            if not batch:
                return
            results.extend((intent.id, intent.claim_token) for intent in batch)
    except BaseException as exc:  # surfaced to the test thread below
        errors.append(exc)
    finally:
        connections.close_all()


def test_eight_threads_claim_every_intent_exactly_once():
    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(INTENTS)]
    ids = Intent.objects.enqueue_many(items, now=T0)
    results: list = []
    errors: list = []
    start = threading.Barrier(THREADS)
    threads = [
        threading.Thread(target=claim_until_empty, args=(1 + i % 3 * 4, results, errors, start))
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    claims = Counter(id for id, _ in results)
    assert set(claims) == set(ids)
    assert max(claims.values()) == 1
    stored = dict(Intent.objects.values_list("id", "claim_token"))
    assert stored == dict(results)
    assert Intent.objects.filter(state="running", attempts=1).count() == INTENTS
