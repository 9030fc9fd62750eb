"""SPEC §16: ``aenqueue`` and ``aenqueue_many`` keep enqueue's contracts, awaited.

Every test drives a coroutine on an event loop with ``async_to_sync``: the
loop runs in another thread, so a synchronous ORM call from inside it raises
``SynchronousOnlyOperation`` as it does in an async view, while the
thread-sensitive executor brings the database work back to this test's
thread and its transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SynchronousOnlyOperation
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, override_settings
from django.urls import path

from django_intents import intent_id
from django_intents.models import Intent

from .conftest import T0, at, row, snapshot

pytestmark = pytest.mark.django_db


def run(make: Callable[[], Awaitable[Any]]) -> Any:
    """Await ``make()`` on an event loop, as an async view would."""

    async def main() -> Any:
        return await make()

    return async_to_sync(main)()


def test_a_synchronous_enqueue_inside_the_event_loop_is_refused_and_writes_nothing():
    async def enqueue() -> str:
        return Intent.objects.enqueue("webhook", "e", "t", now=T0)

    with pytest.raises(SynchronousOnlyOperation):
        run(enqueue)
    assert snapshot() == []


def test_aenqueue_stores_a_pending_intent_with_every_field():
    id = run(
        lambda: Intent.objects.aenqueue(
            "webhook", "order-1-paid", "https://p.example/h", {"order": 1}, now=T0
        )
    )
    assert id == intent_id("webhook", "order-1-paid", "https://p.example/h")
    intent = row(id)
    assert (intent.kind, intent.event_id, intent.target) == (
        "webhook",
        "order-1-paid",
        "https://p.example/h",
    )
    assert (intent.state, intent.attempts, intent.payload) == ("pending", 0, {"order": 1})
    assert intent.next_at == intent.created_at == intent.updated_at == T0


def test_aenqueue_passes_next_at_id_and_priority_through():
    id = run(
        lambda: Intent.objects.aenqueue(
            "job", "e", "t", next_at=at(60), id="my-own-id", now=T0, priority=5
        )
    )
    assert id == "my-own-id"
    assert (row(id).next_at, row(id).priority) == (at(60), 5)


def test_aenqueue_is_idempotent_and_leaves_a_stored_intent_unchanged():
    id = Intent.objects.enqueue("webhook", "e", "t", {"v": 1}, now=T0)
    before = snapshot()
    again = run(
        lambda: Intent.objects.aenqueue("webhook", "e", "t", {"v": 2}, next_at=at(99), now=at(3))
    )
    assert again == id
    assert snapshot() == before


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("", "e", "t"), ValueError, "kind"),
        (("webhook", "", "t"), ValueError, "event_id"),
        (("webhook", "e", ""), ValueError, "target"),
        (("webhoook", "e", "t"), ValueError, "unknown kind 'webhoook'.*did you mean 'webhook'"),
        (("webhook", "e", "t", {1, 2}), TypeError, "payload"),
        (("webhook", "e", "t", float("nan")), ValueError, "payload"),
    ],
)
def test_aenqueue_refuses_bad_input_and_writes_nothing(args, error, message):
    with pytest.raises(error, match=message):
        run(lambda: Intent.objects.aenqueue(*args, now=T0))
    assert snapshot() == []


def test_aenqueue_many_returns_ids_in_input_order_with_duplicates_stored_once():
    existing = Intent.objects.enqueue("job", "b", "t", {"first": "stored"}, now=T0)
    items = [
        {"kind": "job", "event_id": "a", "target": "t", "payload": 1},
        {"kind": "job", "event_id": "b", "target": "t", "payload": 2},
        {"kind": "job", "event_id": "a", "target": "t", "payload": 3},
        {"kind": "job", "event_id": "c", "target": "t", "next_at": at(5), "id": "custom"},
    ]
    ids = run(lambda: Intent.objects.aenqueue_many(items, now=at(1)))
    assert ids == [intent_id("job", "a", "t"), existing, intent_id("job", "a", "t"), "custom"]
    assert Intent.objects.count() == 3
    assert row(ids[0]).payload == 1
    assert (row(existing).payload, row(existing).created_at) == ({"first": "stored"}, T0)
    assert row("custom").next_at == at(5)


def test_aenqueue_many_consumes_a_generator_of_items():
    items = ({"kind": "job", "event_id": str(i), "target": "t"} for i in range(3))
    ids = run(lambda: Intent.objects.aenqueue_many(items, now=T0))
    assert ids == [intent_id("job", str(i), "t") for i in range(3)]
    assert sorted(Intent.objects.values_list("id", flat=True)) == sorted(ids)


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ({"kind": "job", "event_id": "", "target": "t"}, ValueError, r"items\[600\]: event_id"),
        ({"kind": "jobb", "event_id": "e", "target": "t"}, ValueError, "unknown kind 'jobb'"),
        ({"kind": "job", "event_id": "e", "target": "t", "payload": {1}}, TypeError, "payload"),
    ],
)
def test_aenqueue_many_one_bad_item_refuses_the_whole_batch(bad, error, message):
    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(600)]
    with pytest.raises(error, match=message):
        run(lambda: Intent.objects.aenqueue_many([*items, bad], now=T0))
    assert snapshot() == []


def test_aenqueue_many_refuses_a_single_dict_and_writes_nothing():
    item = {"kind": "job", "event_id": "e", "target": "t"}
    with pytest.raises(TypeError, match="iterable of dicts"):
        run(lambda: Intent.objects.aenqueue_many(item, now=T0))
    assert snapshot() == []


# -- the async view of docs/reference.md ---------------------------------------------


async def order_paid(request: HttpRequest) -> JsonResponse:
    order = json.loads(request.body)["order"]
    id = await Intent.objects.aenqueue(
        "webhook",
        event_id=f"order-{order}-paid",
        target="https://partner.example/hooks",
        payload={"order": order},
    )
    return JsonResponse({"intent": id}, status=202)


urlpatterns = [path("orders/paid", order_paid)]


@override_settings(ROOT_URLCONF=__name__)
def test_an_async_view_records_an_intent_once_however_often_it_is_posted():
    client = AsyncClient()

    async def post_twice() -> list[Any]:
        return [
            await client.post("/orders/paid", {"order": 7}, content_type="application/json")
            for _ in range(2)
        ]

    responses = run(post_twice)
    expected = intent_id("webhook", "order-7-paid", "https://partner.example/hooks")
    assert [(r.status_code, r.json()) for r in responses] == [(202, {"intent": expected})] * 2
    assert list(Intent.objects.values_list("id", "state", "payload")) == [
        (expected, "pending", {"order": 7})
    ]
