import hashlib
from datetime import timedelta

import pytest

from django_intents import backoff, intent_id


def test_intent_id_is_sha256_of_nul_joined_fields():
    expected = hashlib.sha256(b"webhook\x00order-1\x00https://x.example").hexdigest()
    assert intent_id("webhook", "order-1", "https://x.example") == expected


def test_intent_id_hashes_utf8():
    expected = hashlib.sha256("push\x00é\x00device-✓".encode()).hexdigest()
    assert intent_id("push", "é", "device-✓") == expected


@pytest.mark.parametrize(
    ("kind", "event_id", "target", "field"),
    [
        ("", "e", "t", "kind"),
        ("k", "", "t", "event_id"),
        ("k", "e", "", "target"),
        ("k" * 101, "e", "t", "kind"),
        ("k", "e" * 256, "t", "event_id"),
        ("k", "e", "t" * 2049, "target"),
        ("k\x00", "e", "t", "kind"),
        ("k", "e\x00", "t", "event_id"),
        ("k", "e", "t\x00", "target"),
        (1, "e", "t", "kind"),
        ("k", None, "t", "event_id"),
        ("k", "e", b"t", "target"),
        (" ", "e", "t", "kind"),
        ("k", "   ", "t", "event_id"),
        ("k", "e", "\t\n", "target"),
        ("k", "\u3000\xa0", "t", "event_id"),
    ],
)
def test_intent_id_refuses_bad_fields_naming_the_field(kind, event_id, target, field):
    with pytest.raises(ValueError, match=field):
        intent_id(kind, event_id, target)


@pytest.mark.parametrize("field", ["kind", "event_id", "target"])
def test_a_blank_field_is_refused_as_blank_naming_it(field):
    fields = {"kind": "k", "event_id": "e", "target": "t", field: "  "}
    with pytest.raises(ValueError, match=f"^{field} must not be blank"):
        intent_id(**fields)


def test_whitespace_around_a_value_is_kept_and_changes_the_id():
    # Ids hash the stored value exactly: trimming would move existing intents.
    padded = intent_id(" k", "order-1 ", "\tt")
    expected = hashlib.sha256(b" k\x00order-1 \x00\tt").hexdigest()
    assert padded == expected != intent_id("k", "order-1", "t")


def test_intent_id_accepts_fields_at_their_limits():
    assert len(intent_id("k" * 100, "e" * 255, "t" * 2048)) == 64


def reference_backoff(id, attempts):
    a = max(attempts, 1)
    s = min(2**a, 3600)
    b = hashlib.sha256((id + str(a)).encode()).digest()[0]
    jitter = (b / 255 - 0.5) * 0.4
    return timedelta(seconds=int(s * (1 + jitter)))


@pytest.mark.parametrize("attempts", [-3, 0, 1, 2, 5, 11, 12, 13, 40, 10_000])
def test_backoff_matches_the_spec_formula(attempts):
    id = intent_id("webhook", "e", "t")
    assert backoff(id, attempts) == reference_backoff(id, attempts)


def test_backoff_is_capped_near_an_hour_with_jitter():
    delays = [backoff(intent_id("k", str(i), "t"), 50) for i in range(50)]
    assert all(timedelta(seconds=2880) <= d <= timedelta(seconds=4320) for d in delays)
    assert len(set(delays)) > 1


def test_backoff_huge_attempt_count_is_fast_and_capped():
    assert backoff("x", 10**12) <= timedelta(seconds=4320)
