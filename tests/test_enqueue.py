from datetime import datetime, timedelta

import pytest
from django.db import transaction

from django_intents import intent_id
from django_intents.models import Intent

from .conftest import T0, at, row, snapshot

pytestmark = pytest.mark.django_db


def test_enqueue_stores_a_pending_intent_with_every_field():
    id = Intent.objects.enqueue(
        "webhook", "order-1-paid", "https://p.example/h", {"order": 1}, now=T0
    )
    intent = row(id)
    assert id == intent_id("webhook", "order-1-paid", "https://p.example/h")
    assert (intent.kind, intent.event_id, intent.target) == (
        "webhook",
        "order-1-paid",
        "https://p.example/h",
    )
    assert intent.payload == {"order": 1}
    assert intent.state == Intent.State.PENDING
    assert intent.attempts == 0
    assert intent.next_at == intent.created_at == intent.updated_at == T0
    assert (intent.last_error, intent.claim_token, intent.claim_until) == ("", "", None)


def test_enqueue_without_now_uses_an_aware_current_time():
    before = datetime.now(tz=T0.tzinfo)
    intent = row(Intent.objects.enqueue("job", "e", "t"))
    assert before - timedelta(seconds=1) <= intent.created_at <= datetime.now(tz=T0.tzinfo)


def test_enqueue_is_idempotent_in_every_state():
    id = Intent.objects.enqueue("webhook", "e", "t", {"v": 1}, now=T0)
    claimed = Intent.objects.claim(now=at(1))
    Intent.objects.complete(id, claimed.claim_token, now=at(2))
    before = snapshot()
    again = Intent.objects.enqueue("webhook", "e", "t", {"v": 2}, next_at=at(99), now=at(3))
    assert again == id
    assert snapshot() == before


def test_enqueue_keeps_explicit_id_and_next_at():
    id = Intent.objects.enqueue("job", "e", "t", next_at=at(60), id="my-own-id", now=T0)
    assert id == "my-own-id"
    assert row(id).next_at == at(60)
    assert row(id).payload is None


@pytest.mark.parametrize(
    "payload",
    [
        None,
        0,
        -7,
        2**62,
        1.5,
        "text ✓",
        True,
        [],
        {},
        [1, "a", None, {"b": [2.25]}],
        {"a": {"b": {"c": []}}},
    ],
)
def test_enqueue_round_trips_any_json_value(payload):
    id = Intent.objects.enqueue("job", repr(payload)[:200], "t", payload, now=T0)
    assert row(id).payload == payload


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("", "e", "t"), ValueError, "kind"),
        (("k", "", "t"), ValueError, "event_id"),
        (("k", "e", ""), ValueError, "target"),
        (("k" * 101, "e", "t"), ValueError, "kind"),
        (("k", "e\x00", "t"), ValueError, "event_id"),
        (("k", "e", 5), ValueError, "target"),
        ((" ", "e", "t"), ValueError, "kind must not be blank"),
        (("k", " \t ", "t"), ValueError, "event_id must not be blank"),
        (("k", "e", "\n"), ValueError, "target must not be blank"),
        (("k", "e", "t", {1, 2}), TypeError, "payload"),
        (("k", "e", "t", {"a": object()}), TypeError, "payload"),
        (("k", "e", "t", {1: "int key"}), TypeError, "payload"),
        (("k", "e", "t", (1, 2)), TypeError, "payload"),
        (("k", "e", "t", float("nan")), ValueError, "payload"),
        (("k", "e", "t", {"a": "\x00"}), ValueError, "payload"),
        (("k", "e", "t", "\ud800"), ValueError, "payload"),
    ],
)
def test_enqueue_refuses_bad_input_and_writes_nothing(args, error, message):
    with pytest.raises(error, match=message):
        Intent.objects.enqueue(*args, now=T0)
    assert snapshot() == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"next_at": "tomorrow"}, "next_at"),
        ({"next_at": datetime(2026, 1, 1)}, "next_at"),
        ({"id": ""}, "id"),
        ({"id": "x" * 65}, "id"),
        ({"now": datetime(2026, 1, 1)}, "now"),
    ],
)
def test_enqueue_refuses_bad_options_and_writes_nothing(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Intent.objects.enqueue("k", "e", "t", **{"now": T0, **kwargs})
    assert snapshot() == []


def test_enqueue_keeps_whitespace_around_a_non_blank_value():
    id = Intent.objects.enqueue("webhook", " order-1 ", "t", now=T0)
    assert id == intent_id("webhook", " order-1 ", "t") != intent_id("webhook", "order-1", "t")
    assert row(id).event_id == " order-1 "


def test_an_explicit_id_of_whitespace_is_still_accepted_as_an_opaque_key():
    assert Intent.objects.enqueue("webhook", "e", "t", id="  ", now=T0) == "  "
    assert row("  ").event_id == "e"


def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        Intent.objects.enqueue("webhook", "e", "t", now=T0)
        raise RuntimeError("business change failed")
    assert snapshot() == []


def test_enqueue_commits_with_the_callers_transaction():
    with transaction.atomic():
        id = Intent.objects.enqueue("webhook", "e", "t", now=T0)
    assert row(id).state == "pending"


def test_enqueue_many_returns_ids_in_input_order_with_duplicates_stored_once():
    existing = Intent.objects.enqueue("job", "b", "t", {"first": "stored"}, now=T0)
    items = [
        {"kind": "job", "event_id": "a", "target": "t", "payload": 1},
        {"kind": "job", "event_id": "b", "target": "t", "payload": 2},
        {"kind": "job", "event_id": "a", "target": "t", "payload": 3},
        {"kind": "job", "event_id": "c", "target": "t", "next_at": at(5), "id": "custom"},
    ]
    ids = Intent.objects.enqueue_many(items, now=at(1))
    assert ids == [intent_id("job", "a", "t"), existing, intent_id("job", "a", "t"), "custom"]
    assert Intent.objects.count() == 3
    assert row(ids[0]).payload == 1
    assert row(existing).payload == {"first": "stored"}
    assert row(existing).created_at == T0
    assert row("custom").next_at == at(5)


def test_enqueue_many_spans_several_statement_batches():
    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(1234)]
    ids = Intent.objects.enqueue_many(items, now=T0)
    assert len(ids) == len(set(ids)) == 1234
    assert Intent.objects.filter(state="pending").count() == 1234


def test_enqueue_many_of_nothing_writes_nothing():
    assert Intent.objects.enqueue_many([], now=T0) == []
    assert snapshot() == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"kind": "job", "event_id": "", "target": "t"}, r"items\[600\]: event_id"),
        ({"kind": "job", "event_id": "  ", "target": "t"}, r"items\[600\]: event_id .*blank"),
        ({"kind": " ", "event_id": "e", "target": "t"}, r"items\[600\]: kind .*blank"),
        ({"kind": "job", "event_id": "e", "target": "\t"}, r"items\[600\]: target .*blank"),
        ({"kind": "job", "target": "t"}, r"items\[600\]: missing event_id"),
        ({"kind": "job", "event_id": "e", "target": "t", "colour": 1}, r"items\[600\]: unknown"),
        ({"kind": "job", "event_id": "e", "target": "t", "payload": {1}}, r"items\[600\]: payload"),
        ("not a dict", r"items\[600\]: must be a dict"),
    ],
)
def test_enqueue_many_one_bad_item_refuses_the_whole_batch(bad, message):
    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(600)]
    with pytest.raises((TypeError, ValueError), match=message):
        Intent.objects.enqueue_many([*items, bad], now=T0)
    assert snapshot() == []


def test_enqueue_many_inside_a_rolled_back_transaction_leaves_nothing():
    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(700)]
    with pytest.raises(RuntimeError), transaction.atomic():
        Intent.objects.enqueue_many(items, now=T0)
        raise RuntimeError("rolled back")
    assert snapshot() == []


def test_enqueue_many_refuses_a_single_dict():
    with pytest.raises(TypeError, match="items"):
        Intent.objects.enqueue_many({"kind": "job", "event_id": "e", "target": "t"}, now=T0)
    assert snapshot() == []
