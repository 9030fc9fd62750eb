"""SPEC §6 metrics: scraped from /metrics after known work, with exact labels and deltas.

Counters are process-global and other tests move them too, so every check here
compares a scrape before with a scrape after. The gauges read the database;
their cache is dropped before each test so one test's rows never leak into
another's scrape.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_prometheus.testutils import assert_metric_diff, get_metric, save_registry
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from django_intents.handlers import forget_kinds, metric_kinds, registry
from django_intents.models import Intent
from django_intents.observability import gauges, metrics
from django_intents.rules.kinds import TASK_KIND
from django_intents.signals import attempt_finished
from django_intents.store.clock import server_now

from . import settings as suite_settings
from .conftest import T0, at, external_kinds, intents
from .workerutil import Worker, wait_for

ROOT = Path(__file__).resolve().parent.parent
# The kinds the suite declares when the app starts: its EXTERNAL_KINDS, the
# handlers of tests/testapp/handlers.py and the django.tasks kind.
DECLARED = {*suite_settings.EXTERNAL_KINDS, "test.ok", "test.fail", "test.stamp", TASK_KIND}
LABELS = {
    "django_intents_pending": {"kind", "database"},
    "django_intents_oldest_due_age_seconds": {"kind", "database"},
    "django_intents_oldest_running_seconds": {"kind", "database"},
    "django_intents_paused": {"kind", "database"},
    "django_intents_targets": {"kind", "state", "database"},
    "django_intents_breaker_transitions_total": {"kind", "to", "database"},
    "django_intents_handler_duration_seconds": {"kind", "outcome", "database"},
    "django_intents_transitions_total": {"kind", "to", "database"},
    "django_intents_rescued_total": {"kind", "database"},
    "django_intents_rescue_delay_seconds": {"kind", "database"},
}
TYPES = {
    "django_intents_pending": "gauge",
    "django_intents_oldest_due_age_seconds": "gauge",
    "django_intents_oldest_running_seconds": "gauge",
    "django_intents_paused": "gauge",
    "django_intents_targets": "gauge",
    "django_intents_breaker_transitions_total": "counter",
    "django_intents_handler_duration_seconds": "histogram",
    "django_intents_transitions_total": "counter",
    "django_intents_rescued_total": "counter",
    "django_intents_rescue_delay_seconds": "histogram",
}
# Series that only this process's work moves (the gauges read the database instead).
COUNTED = (
    "django_intents_transitions_total",
    "django_intents_breaker_transitions_total",
    "django_intents_rescued_total",
    "django_intents_rescue_delay_seconds_count",
    "django_intents_rescue_delay_seconds_sum",
    "django_intents_handler_duration_seconds_count",
    "django_intents_handler_duration_seconds_sum",
)

Series = tuple[str, frozenset[tuple[str, str]]]
WEBHOOK = {"kind": "webhook", "database": "default"}  # the labels of a webhook series


def parse(text: str) -> dict[Series, float]:
    samples: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"{key} exported twice"
            samples[key] = sample.value
    return samples


def scrape(client: Any) -> dict[Series, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return parse(response.content.decode())


def series(name: str, **labels: str) -> Series:
    """A series of ``name``: every one is of a database, ``default`` unless named."""
    return (name, frozenset({"database": "default", **labels}.items()))


def changes(before: dict[Series, float], after: dict[Series, float]) -> dict[Series, float]:
    """Every counted series that moved, with how much."""
    moved = {}
    for key, value in after.items():
        if key[0] in COUNTED:
            diff = value - before.get(key, 0.0)
            if diff:
                moved[key] = pytest.approx(diff)
    return moved


def label_sets(samples: dict[Series, float], name: str) -> set[frozenset[tuple[str, str]]]:
    return {labels for sample_name, labels in samples if sample_name == name}


@pytest.fixture(autouse=True)
def fresh_gauges() -> Iterator[None]:
    metrics.QUEUE.invalidate()
    yield
    metrics.QUEUE.invalidate()


# -- the six metrics, as exported --------------------------------------------------


@pytest.mark.django_db
def test_every_metric_is_exported_once_with_its_type_and_help(client):
    text = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in TYPES.items():
        family_name = name.removesuffix("_total") if kind == "counter" else name
        assert families[family_name].type == kind, name
        assert families[family_name].documentation, f"{name} has no help text"
        assert text.count(f"# TYPE {name} {kind}\n") == 1


@pytest.mark.django_db
def test_every_metric_has_exactly_its_spec_labels(client):
    samples = scrape(client)
    for name, labels in LABELS.items():
        # A histogram's buckets add "le"; its count and sum carry exactly the metric's labels.
        names = [f"{name}_count", f"{name}_sum"] if TYPES[name] == "histogram" else [name]
        for sample_name in names:
            sets = label_sets(samples, sample_name)
            assert sets, f"{sample_name} has no series"
            assert {frozenset(dict(s)) for s in sets} == {frozenset(labels)}, sample_name


@pytest.mark.django_db
def test_children_of_the_declared_kinds_exist_before_any_work(client):
    samples = scrape(client)
    kinds = {*DECLARED, "other"}
    assert label_sets(samples, "django_intents_transitions_total") >= {
        frozenset({"kind": k, "to": to, "database": "default"}.items())
        for k in kinds
        for to in ("pending", "running", "completed", "cancelled")
    }
    assert label_sets(samples, "django_intents_handler_duration_seconds_count") >= {
        frozenset({"kind": k, "outcome": o, "database": "default"}.items())
        for k in kinds
        for o in ("success", "error", "stopped", "snoozed", "fenced")
    }
    for name in ("django_intents_rescued_total", "django_intents_rescue_delay_seconds_count"):
        assert label_sets(samples, name) >= {
            frozenset({"kind": k, "database": "default"}.items()) for k in kinds
        }
    # The gauges list the kinds declared now (a test may have registered one more).
    now_declared = {*metric_kinds(), "other"}
    assert now_declared >= kinds
    for name in ("django_intents_pending", "django_intents_oldest_due_age_seconds"):
        assert label_sets(samples, name) == {
            frozenset({"kind": k, "database": "default"}.items()) for k in now_declared
        }


# -- counters after a known sequence ---------------------------------------------------


@external_kinds("mystery")
@pytest.mark.django_db(transaction=True)
def test_known_sequence_moves_exactly_the_expected_series(client):
    before = scrape(client)
    objects = Intent.objects
    a = objects.enqueue("webhook", "a", "https://h.example", now=at(0))
    b = objects.enqueue("webhook", "b", "https://h.example", now=at(1))
    c = objects.enqueue("webhook", "c", "https://h.example", now=at(2))
    d = objects.enqueue("push", "d", "device-1", now=at(3))
    e = objects.enqueue("mystery", "e", "somewhere", now=at(4))
    f = objects.enqueue("job", "f", "batch", now=at(5))
    g = objects.enqueue("delivery", "g", "inline", now=at(6))
    assert objects.enqueue("webhook", "a", "https://h.example", now=at(7)) == a  # idempotent
    assert objects.complete_pending(g, now=at(8))  # the caller did the work inline

    first = objects.claim(now=at(10), kinds=["webhook"])
    assert first.id == a
    assert objects.complete(a, first.claim_token, now=at(11))
    second = objects.claim(now=at(12), kinds=["webhook"])
    assert second.id == b
    assert objects.retry(b, second.claim_token, "HTTP 503", now=at(13))
    odd = objects.claim(now=at(14), kinds=["mystery"])
    assert objects.cancel_claim(e, odd.claim_token, "gone", now=at(15))
    assert objects.retry_now(c, now=at(16))  # administrative, on a pending intent
    assert objects.cancel(d, now=at(17))  # administrative
    lost = objects.claim(now=at(20), lease=30, kinds=["job"])
    rescue = objects.claim(now=at(65), kinds=["job"])  # lease ended at(50): 15 s late
    assert (lost.id, rescue.id) == (f, f)
    assert not objects.complete(f, lost.claim_token, now=at(66))  # fenced: no transition
    assert objects.complete(f, rescue.claim_token, now=at(67))

    metrics.QUEUE.invalidate()  # the first scrape cached the gauges' rows
    after = scrape(client)
    moved = "django_intents_transitions_total"
    assert changes(before, after) == {
        series(moved, kind="webhook", to="pending"): 5,  # a, b, c; b's retry; c's retry_now
        series(moved, kind="webhook", to="running"): 2,
        series(moved, kind="webhook", to="completed"): 1,
        series(moved, kind="push", to="pending"): 1,
        series(moved, kind="push", to="cancelled"): 1,
        series(moved, kind="mystery", to="pending"): 1,  # declared in EXTERNAL_KINDS
        series(moved, kind="mystery", to="running"): 1,
        series(moved, kind="mystery", to="cancelled"): 1,
        series(moved, kind="job", to="pending"): 1,
        series(moved, kind="job", to="running"): 2,
        series(moved, kind="job", to="completed"): 1,
        series(moved, kind="delivery", to="pending"): 1,
        series(moved, kind="delivery", to="completed"): 1,
        series("django_intents_rescued_total", kind="job"): 1,
        series("django_intents_rescue_delay_seconds_count", kind="job"): 1,
        series("django_intents_rescue_delay_seconds_sum", kind="job"): 15.0,
    }
    # b and c are the only pending rows; both have been due since January.
    assert after[series("django_intents_pending", kind="webhook")] == 2
    for kind in ("push", "job", "mystery", "other", "delivery", "replication"):
        assert after[series("django_intents_pending", kind=kind)] == 0
    oldest = min(Intent.objects.get(pk=id).next_at for id in (b, c))  # b's backoff or c's retry_now
    waited = (timezone.now() - oldest).total_seconds()
    age = after[series("django_intents_oldest_due_age_seconds", kind="webhook")]
    assert waited - 60 < age <= waited


@pytest.mark.django_db
def test_rescue_delay_lands_in_the_matching_buckets(client, django_capture_on_commit_callbacks):
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        Intent.objects.enqueue("delivery", "r", "t", now=T0)
        Intent.objects.claim(now=at(1), lease=10)
        Intent.objects.claim(now=at(11 + 45))  # lease ended at(11)
    after = scrape(client)
    name = "django_intents_rescue_delay_seconds_bucket"
    for le, expected in (("30.0", 0), ("60.0", 1), ("3600.0", 1), ("+Inf", 1)):
        key = series(name, kind="delivery", le=le)
        assert after[key] - before.get(key, 0) == expected, le
    assert (
        after[series("django_intents_rescued_total", kind="delivery")]
        - before[series("django_intents_rescued_total", kind="delivery")]
        == 1
    )


@pytest.mark.django_db(transaction=True)
def test_a_rescue_is_counted_when_its_claim_commits_and_never_when_rolled_back():
    def rescued() -> float:
        return (
            REGISTRY.get_sample_value(
                "django_intents_rescued_total", {"kind": "job", "database": "default"}
            )
            or 0.0
        )

    class Abort(Exception):
        pass

    Intent.objects.enqueue("job", "rescued", "t", now=T0)
    Intent.objects.claim(now=at(1), lease=10)  # a worker that died holding it
    start = rescued()
    with pytest.raises(Abort), transaction.atomic():
        assert Intent.objects.claim(now=at(20)) is not None
        raise Abort
    assert rescued() == start  # the takeover rolled back: nothing was rescued
    assert Intent.objects.get().attempts == 1
    with transaction.atomic():
        assert Intent.objects.claim(now=at(21)) is not None
        assert rescued() == start  # not yet: it may still roll back
    assert rescued() == start + 1


@pytest.mark.django_db(transaction=True)
def test_transitions_are_counted_when_committed_and_never_when_rolled_back():
    def count() -> float:
        return REGISTRY.get_sample_value(
            "django_intents_transitions_total",
            {"kind": "webhook", "to": "pending", "database": "default"},
        )

    start = count()
    with transaction.atomic():
        Intent.objects.enqueue("webhook", "committed", "t", now=T0)
        assert count() == start  # not yet: the row may still roll back
    assert count() == start + 1

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        Intent.objects.enqueue("webhook", "rolled-back", "t", now=T0)
        raise Abort
    assert count() == start + 1


def test_by_default_every_kind_the_project_declares_keeps_its_label():
    assert metric_kinds() >= DECLARED
    assert metrics.kind_label(TASK_KIND) == TASK_KIND
    assert metrics.kind_label("test.ok") == "test.ok"  # a @handler of tests/testapp
    assert metrics.kind_label("webhook") == "webhook"  # an EXTERNAL_KINDS entry
    assert metrics.kind_label("tenant-42-export") == "other"  # declared nowhere


def test_a_dotted_handler_path_declares_its_kind_for_metrics_without_importing_it():
    with override_settings(INTENTS=intents(HANDLERS={"billing": "tests.testapp.handlers.dotted"})):
        assert metrics.kind_label("billing") == "billing"
    assert metrics.kind_label("billing") == "other"


def test_the_default_labels_follow_a_change_of_external_kinds():
    assert metrics.kind_label("billing.invoice") == "other"
    with override_settings(INTENTS=intents(EXTERNAL_KINDS=["billing.invoice"])):
        assert metrics.kind_label("billing.invoice") == "billing.invoice"
        # The suite's own EXTERNAL_KINDS are replaced: "replication" has no handler.
        assert metrics.kind_label("replication") == "other"
        assert metrics.kind_label("test.ok") == "test.ok"  # still has its handler
        assert metrics.kind_label(TASK_KIND) == TASK_KIND
    assert metrics.kind_label("replication") == "replication"
    assert metrics.kind_label("billing.invoice") == "other"


def test_a_handler_registered_later_keeps_its_label_from_then_on(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    assert metrics.kind_label("digest") == "other"
    registry.register("digest", lambda intent, attempt: None)
    assert metrics.kind_label("digest") == "digest"
    monkeypatch.undo()
    forget_kinds()
    assert metrics.kind_label("digest") == "other"


def test_metric_kinds_replaces_the_declared_kinds_when_set():
    with override_settings(INTENTS=intents(METRIC_KINDS=["webhook"])):
        assert metric_kinds() == {"webhook"}
        assert metrics.kind_label("test.ok") == "other"
        assert metrics.kind_label(TASK_KIND) == "other"
    assert metrics.kind_label("test.ok") == "test.ok"


@pytest.mark.django_db
def test_a_kind_with_a_handler_is_counted_and_gauged_under_its_own_name(
    client, django_capture_on_commit_callbacks
):
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        Intent.objects.enqueue("test.ok", "e", "t", now=T0)
    metrics.QUEUE.invalidate()  # the first scrape cached the gauges' rows
    after = scrape(client)
    assert changes(before, after) == {
        series("django_intents_transitions_total", kind="test.ok", to="pending"): 1,
    }
    assert after[series("django_intents_pending", kind="test.ok")] == 1
    assert after[series("django_intents_pending", kind="other")] == 0


@pytest.mark.django_db
def test_a_kind_the_project_does_not_declare_is_reported_as_other_everywhere(
    client, django_capture_on_commit_callbacks
):
    with external_kinds("tenant-42-export"):  # run by a service this project no longer lists
        id = Intent.objects.enqueue("tenant-42-export", "e", "t", now=T0)
    before = scrape(client)
    with django_capture_on_commit_callbacks(execute=True):
        claimed = Intent.objects.claim(now=at(1))
        assert claimed is not None and claimed.id == id
        assert Intent.objects.retry(id, claimed.claim_token, "boom", now=at(2))
    attempt_finished.send(
        sender=Intent, kind="tenant-42-export", outcome="error", duration=0.2, intent=None
    )
    metrics.QUEUE.invalidate()
    after = scrape(client)
    assert changes(before, after) == {
        series("django_intents_transitions_total", kind="other", to="running"): 1,
        series("django_intents_transitions_total", kind="other", to="pending"): 1,
        series("django_intents_handler_duration_seconds_count", kind="other", outcome="error"): 1,
        series("django_intents_handler_duration_seconds_sum", kind="other", outcome="error"): 0.2,
    }
    assert after[series("django_intents_pending", kind="other")] == 1
    assert Intent.objects.get(pk=id).state == "pending"
    assert not any("tenant-42-export" in dict(labels).values() for _, labels in after)


@pytest.mark.django_db
def test_metric_kinds_setting_decides_which_kinds_keep_their_label(
    client, django_capture_on_commit_callbacks
):
    before = scrape(client)
    with (
        override_settings(INTENTS=intents(METRIC_KINDS=["tenant-export"])),
        external_kinds("tenant-export"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        Intent.objects.enqueue("tenant-export", "e", "t", now=T0)
        Intent.objects.enqueue("webhook", "e", "t", now=T0)
    moved = changes(before, scrape(client))
    assert moved == {
        series("django_intents_transitions_total", kind="tenant-export", to="pending"): 1,
        series("django_intents_transitions_total", kind="other", to="pending"): 1,
    }


@pytest.mark.django_db
def test_a_change_of_metric_kinds_moves_the_handler_duration_to_the_new_label(client):
    def finished() -> None:
        attempt_finished.send(
            sender=Intent, kind="tenant-export", outcome="success", duration=0.5, intent=None
        )

    count = "django_intents_handler_duration_seconds_count"
    before = scrape(client)
    finished()  # not listed: "other"
    with override_settings(INTENTS=intents(METRIC_KINDS=["tenant-export"])):
        finished()  # listed now: its own label, though "other" was observed a moment ago
    finished()  # and "other" again once the setting is back
    assert changes(before, scrape(client)) == {
        series(count, kind="other", outcome="success"): 2,
        series(count.replace("_count", "_sum"), kind="other", outcome="success"): 1.0,
        series(count, kind="tenant-export", outcome="success"): 1,
        series(count.replace("_count", "_sum"), kind="tenant-export", outcome="success"): 0.5,
    }


@pytest.mark.django_db
def test_per_tenant_kinds_add_no_cached_series_beyond_other(client):
    before = scrape(client)
    for n in range(200):
        attempt_finished.send(
            sender=Intent, kind=f"tenant-{n}-export", outcome="error", duration=0.1, intent=None
        )
    assert ("other", "error", "default") in metrics._durations
    assert not any(re.fullmatch(r"tenant-\d+-export", label) for label, _, _ in metrics._durations)
    moved = changes(before, scrape(client))
    assert (
        moved[
            series("django_intents_handler_duration_seconds_count", kind="other", outcome="error")
        ]
        == 200
    )


# -- handler duration --------------------------------------------------------------------


@pytest.mark.django_db  # reading the registry runs the gauges' query
def test_attempt_finished_observes_handler_duration_per_outcome():
    registry = save_registry()
    observed = {"success": 0.02, "error": 0.3, "stopped": 4.0, "snoozed": 0.5, "fenced": 45.0}
    for outcome, duration in observed.items():
        attempt_finished.send(
            sender=Intent, kind="webhook", outcome=outcome, duration=duration, intent=None
        )
    name = "django_intents_handler_duration_seconds"
    for outcome, duration in observed.items():
        assert_metric_diff(registry, 1, f"{name}_count", outcome=outcome, **WEBHOOK)
        assert_metric_diff(registry, duration, f"{name}_sum", outcome=outcome, **WEBHOOK)
    labels = {**WEBHOOK, "outcome": "success"}
    assert_metric_diff(registry, 1, f"{name}_bucket", le="0.025", **labels)
    assert_metric_diff(registry, 0, f"{name}_bucket", le="0.01", **labels)
    assert_metric_diff(registry, 1, f"{name}_bucket", le="60.0", outcome="fenced", **WEBHOOK)
    assert_metric_diff(registry, 0, f"{name}_bucket", le="30.0", outcome="fenced", **WEBHOOK)


@pytest.mark.django_db
def test_attempt_finished_with_an_unknown_outcome_is_a_bug_not_a_new_series():
    registry = save_registry()
    with pytest.raises(ValueError, match="outcome='crashed'"):
        attempt_finished.send(
            sender=Intent, kind="webhook", outcome="crashed", duration=1.0, intent=None
        )
    assert (
        get_metric("django_intents_handler_duration_seconds_count", outcome="crashed", **WEBHOOK)
        is None
    )
    assert_metric_diff(
        registry,
        0,
        "django_intents_handler_duration_seconds_count",
        outcome="error",
        **WEBHOOK,
    )


# -- scrape-time gauges --------------------------------------------------------------------


@pytest.mark.django_db
def test_pending_gauge_counts_pending_rows_per_kind(client):
    now = timezone.now()
    items = [
        {"kind": "webhook", "event_id": "w1", "target": "t"},
        {"kind": "webhook", "event_id": "w2", "target": "t"},
        {
            "kind": "webhook",
            "event_id": "later",
            "target": "t",
            "next_at": now + timedelta(hours=1),
        },
        {"kind": "push", "event_id": "p1", "target": "t"},
        {"kind": "job", "event_id": "j1", "target": "t"},
        {"kind": "mystery", "event_id": "m1", "target": "t"},
        {"kind": "enigma", "event_id": "e1", "target": "t"},
        {"kind": "enigma", "event_id": "e2", "target": "t"},
    ]
    # mystery and enigma were declared when enqueued, by a service since gone.
    with external_kinds("mystery", "enigma"):
        Intent.objects.enqueue_many(items, now=now - timedelta(seconds=5))
    running = Intent.objects.claim(now=now, kinds=["push"])
    done = Intent.objects.claim(now=now, kinds=["job"])
    Intent.objects.complete(done.id, done.claim_token, now=now)
    assert running is not None

    samples = scrape(client)
    pending = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "django_intents_pending"
    }
    assert pending == {
        **dict.fromkeys(metric_kinds(), 0),  # every declared kind, the idle ones at 0
        "webhook": 3,  # the scheduled one too: pending means the state
        "push": 0,  # running is not pending
        "job": 0,  # completed
        "other": 3,  # mystery and enigma, declared no more: folded
    }
    assert {"delivery", "replication", "test.ok", TASK_KIND} <= set(pending)


@external_kinds("mystery")
@pytest.mark.django_db
def test_oldest_due_age_measures_from_next_at_or_from_lease_expiry(client):
    now = timezone.now()

    def ago(seconds: float):
        return now - timedelta(seconds=seconds)

    Intent.objects.enqueue("webhook", "old", "t", next_at=ago(120), now=ago(200))
    Intent.objects.enqueue("webhook", "young", "t", next_at=ago(30), now=ago(200))
    Intent.objects.enqueue("webhook", "future", "t", next_at=ago(-600), now=ago(200))
    # push: due 1000 s ago but claimed, and its lease ran out 300 s ago.
    Intent.objects.enqueue("push", "stalled", "t", next_at=ago(1000), now=ago(1000))
    Intent.objects.claim(now=ago(400), lease=100, kinds=["push"])
    # job: claimed with a live lease, so nothing of it is due.
    Intent.objects.enqueue("job", "busy", "t", next_at=ago(1000), now=ago(1000))
    Intent.objects.claim(now=now, lease=600, kinds=["job"])
    Intent.objects.enqueue("mystery", "soon", "t", next_at=ago(-60), now=ago(10))

    samples = scrape(client)
    age = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "django_intents_oldest_due_age_seconds"
    }
    assert 120 <= age["webhook"] < 150
    assert 300 <= age["push"] < 330
    assert age["job"] == 0
    assert age["mystery"] == age["other"] == 0  # mystery is not due yet
    assert age["delivery"] == age["replication"] == 0


@external_kinds("mystery")
@pytest.mark.django_db
def test_oldest_running_measures_from_when_the_running_attempt_became_due(client):
    now = server_now()

    def ago(seconds: float):
        return now - timedelta(seconds=seconds)

    # webhook: due 700 s ago, claimed 600 s ago, its lease renewed since: 700 s.
    Intent.objects.enqueue("webhook", "hung", "t", next_at=ago(700), now=ago(700))
    hung = Intent.objects.claim(now=ago(600), lease=30, kinds=["webhook"])
    assert hung is not None
    assert Intent.objects.renew(hung.id, hung.claim_token, now=ago(5), lease=30)
    Intent.objects.enqueue("webhook", "fresh", "t", next_at=ago(20), now=ago(20))
    Intent.objects.claim(now=ago(20), lease=30, kinds=["webhook"])
    # push: pending only, nothing runs. mystery: running, under its own label.
    Intent.objects.enqueue("push", "waiting", "t", next_at=ago(900), now=ago(900))
    Intent.objects.enqueue("mystery", "m", "t", next_at=ago(50), now=ago(50))
    Intent.objects.claim(now=ago(40), lease=600, kinds=["mystery"])

    samples = scrape(client)
    running = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "django_intents_oldest_running_seconds"
    }
    assert 700 <= running["webhook"] < 730
    assert running["push"] == 0
    assert 50 <= running["mystery"] < 80
    assert running["other"] == 0
    assert running["delivery"] == 0


def big_queue(n: int) -> None:
    Intent.objects.enqueue_many(
        [{"kind": "webhook", "event_id": f"e{i}", "target": "t"} for i in range(n)]
    )


@pytest.mark.django_db
def test_gauges_estimate_a_backlog_past_the_bound(client, monkeypatch):
    monkeypatch.setattr(gauges, "EXACT_UP_TO", 3)
    big_queue(5)
    Intent.objects.enqueue("push", "p", "t")
    claimed = Intent.objects.claim(kinds=["push"])
    assert claimed is not None
    first = scrape(client)  # exact: it finds more than the bound
    assert first[series("django_intents_pending", kind="webhook")] == 5
    assert label_sets(first, "django_intents_limited")
    metrics.QUEUE.expire()  # the cache expires; the next read estimates

    def exact(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the exact backlog was read past the bound")

    if connection.vendor == "sqlite":  # no estimates: always exact
        second = scrape(client)
        assert second[series("django_intents_pending", kind="webhook")] == 5
        return
    # The planner's figure for five rows may be anything: at most, check it is its.
    monkeypatch.setattr(gauges, "EXACT_UP_TO", -1)
    monkeypatch.setattr(gauges, "read_backlog", exact)
    with CaptureQueriesContext(connection) as queries:
        second = scrape(client)
    assert any("EXPLAIN" in query["sql"].upper() for query in queries)
    assert series("django_intents_pending", kind="webhook") in second
    assert not label_sets(second, "django_intents_limited")  # unknown past the bound
    assert second[series("django_intents_oldest_running_seconds", kind="webhook")] == 0
    assert second[series("django_intents_oldest_running_seconds", kind="push")] >= 0


@pytest.mark.django_db
def test_gauges_are_exact_again_once_the_backlog_is_back_under_the_bound(client, monkeypatch):
    monkeypatch.setattr(gauges, "EXACT_UP_TO", 3)
    big_queue(5)
    scrape(client)
    assert metrics.QUEUE._readings["default"].estimating is True
    Intent.objects.filter(kind="webhook").update(state="completed")
    # Estimates lag (the planner's statistics are refreshed now and then): a bound
    # far above the five intents, so that any estimate is under it.
    monkeypatch.setattr(gauges, "EXACT_UP_TO", 1000)
    metrics.QUEUE.expire()
    samples = scrape(client)
    assert samples[series("django_intents_pending", kind="webhook")] == 0
    assert label_sets(samples, "django_intents_limited")
    assert metrics.QUEUE._readings["default"].estimating is False


@pytest.mark.django_db
def test_gauges_are_read_by_one_grouped_query_and_cached(client):
    Intent.objects.enqueue("webhook", "one", "t")
    with override_settings(INTENTS=intents(GAUGE_CACHE=1.0)):
        with CaptureQueriesContext(connection) as first:
            samples = scrape(client)
        # The backlog's query, and the targets' (django_intents_targets).
        assert len(first) == 2
        assert all("GROUP BY" in query["sql"].upper() for query in first)
        assert samples[series("django_intents_pending", kind="webhook")] == 1

        Intent.objects.enqueue("webhook", "two", "t")
        with CaptureQueriesContext(connection) as cached:
            samples = scrape(client)
        assert len(cached) == 0
        assert samples[series("django_intents_pending", kind="webhook")] == 1

        time.sleep(1.1)
        with CaptureQueriesContext(connection) as expired:
            samples = scrape(client)
        assert len(expired) == 2
        assert samples[series("django_intents_pending", kind="webhook")] == 2


@pytest.mark.django_db
def test_a_failing_gauge_query_still_serves_the_counters(client, monkeypatch, caplog):
    def broken(now=None, using=None):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(gauges, "read_backlog", broken)
    samples = scrape(client)
    assert not label_sets(samples, "django_intents_pending")
    assert label_sets(samples, "django_intents_transitions_total")
    assert "could not read the queue" in caplog.text


# -- cost on the hot path ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_claim_complete_cost_the_same_with_10_or_10000_pending():
    def fill(start: int, stop: int) -> None:
        Intent.objects.enqueue_many(
            [
                {"kind": "webhook", "event_id": f"bulk-{i}", "target": "t"}
                for i in range(start, stop)
            ],
            now=T0,
        )

    def measure(tag: str) -> tuple[list[int], list[str]]:
        counts, statements = [], []
        with CaptureQueriesContext(connection) as queries:
            Intent.objects.enqueue("webhook", f"probe-{tag}", "t", now=at(1))
        counts.append(len(queries))
        statements += [q["sql"] for q in queries]
        with CaptureQueriesContext(connection) as queries:
            intent = Intent.objects.claim(now=at(2))
        counts.append(len(queries))
        statements += [q["sql"] for q in queries]
        with CaptureQueriesContext(connection) as queries:
            assert Intent.objects.complete(intent.id, intent.claim_token, now=at(3))
        counts.append(len(queries))
        statements += [q["sql"] for q in queries]
        return counts, statements

    def moved() -> float:
        return REGISTRY.get_sample_value(
            "django_intents_transitions_total",
            {"kind": "webhook", "to": "completed", "database": "default"},
        )

    start = moved()
    fill(0, 10)
    small, _ = measure("small")
    fill(10, 10_000)
    assert Intent.objects.filter(state="pending").count() == 10_000
    large, statements = measure("large")

    assert small == large
    assert all(1 <= n <= 5 for n in large), large
    # No statement counts the table (PostgreSQL's insert counts the rows it inserted, per kind).
    table = Intent._meta.db_table.upper()
    assert not [s for s in statements if re.search(rf"COUNT\([^)]*\) FROM \W?{table}\b", s.upper())]
    assert moved() == start + 2  # the metrics receivers were live all along


# -- exposition outside Django: the worker's port ----------------------------------------


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own http URL
        return response.status, response.read().decode()


@pytest.mark.django_db(transaction=True)
def test_serve_exports_every_metric_over_http():
    Intent.objects.enqueue("replication", "r1", "replica-2")
    server = metrics.serve("127.0.0.1", 0, lambda: True)
    try:
        status, text = fetch(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    assert status == 200
    for name, kind in TYPES.items():
        assert f"# TYPE {name} {kind}\n" in text
    samples = parse(text)
    assert samples[series("django_intents_pending", kind="replication")] == 1


def test_serve_binds_to_loopback_by_default():
    server = metrics.serve(port=0)
    try:
        assert server.address[0] == "127.0.0.1"
        assert metrics.DEFAULT_ADDR == "127.0.0.1"
    finally:
        server.close()


def test_serve_answers_404_outside_its_two_paths():
    server = metrics.serve(port=0)
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            fetch(f"http://127.0.0.1:{server.port}/admin/")
        error.value.close()
        assert error.value.code == 404
    finally:
        server.close()


def test_serve_releases_its_port_when_closed():
    server = metrics.serve(port=0)
    port = server.port
    server.close()
    again = metrics.serve("127.0.0.1", port, lambda: True)
    again.close()


# -- a real worker process ---------------------------------------------------------------


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``run_intent_workers`` subprocesses on the test database, killed at teardown.

    ``transactional_db`` commits what the test writes, so the worker sees it.
    """
    workers: list[Worker] = []

    def start(*args: str, intents: dict[str, Any]) -> Worker:
        workers.append(Worker(list(args), intents, {}))
        return workers[-1]

    yield start
    for worker in workers:
        worker.cleanup()


def test_worker_metrics_port_exports_its_attempts_over_http(start_worker):
    now = timezone.now()
    # An intent whose claimant died: its lease ran out 40 s ago, the pool rescues it.
    Intent.objects.enqueue("test.ok", "orphan", "t", next_at=now - timedelta(seconds=100))
    Intent.objects.claim(now=now - timedelta(seconds=50), lease=10, kinds=["test.ok"])
    for i in range(3):
        Intent.objects.enqueue("test.ok", f"ok-{i}", "t")
    Intent.objects.enqueue("test.fail", "fail", "t")
    Intent.objects.enqueue("test.stop", "stop", "t")
    Intent.objects.enqueue("test.stamp", "unlisted", "t")  # not in METRIC_KINDS: "other"
    Intent.objects.enqueue("webhook", "no-handler", "t", next_at=now - timedelta(seconds=30))

    worker = start_worker(
        "--metrics-port",
        "0",
        "--kinds",
        "test.ok,test.fail,test.stop,test.stamp",
        intents={
            "MAX_ATTEMPTS": 2,
            "METRIC_KINDS": ["test.ok", "test.fail", "test.stop"],
            "GAUGE_CACHE": 0.1,  # polled below: a cached early scrape must not stick
        },
    )
    found = wait_for(
        lambda: re.search(r"serving /metrics and /healthz on ([\d.]+):(\d+)", worker.log),
        "the metrics port",
    )
    assert found.group(1) == "127.0.0.1"
    base = f"http://127.0.0.1:{found.group(2)}"

    name = "django_intents_handler_duration_seconds_count"
    expected = {
        ("test.ok", "success"): 4,
        ("test.fail", "error"): 2,  # retried once, then cancelled by MAX_ATTEMPTS 2
        ("test.stop", "stopped"): 1,
        ("other", "success"): 1,
    }

    def attempts() -> dict[tuple[str, str], float]:
        samples = parse(fetch(f"{base}/metrics")[1])
        return {
            (dict(labels)["kind"], dict(labels)["outcome"]): value
            for (sample, labels), value in samples.items()
            if sample == name and value
        }

    # attempt_finished follows each attempt's transition, so once every attempt
    # is observed, every transition has been counted too.
    wait_for(lambda: attempts() == expected, "the pool to run every intent", timeout=30)
    time.sleep(0.2)  # past GAUGE_CACHE, so the gauges below are read afresh
    samples = parse(fetch(f"{base}/metrics")[1])
    transitions = {
        (dict(labels)["kind"], dict(labels)["to"]): value
        for (sample, labels), value in samples.items()
        if sample == "django_intents_transitions_total" and value
    }
    assert transitions == {  # enqueues happened in this process, not the worker's
        ("test.ok", "running"): 4,
        ("test.ok", "completed"): 4,
        ("test.fail", "running"): 2,
        ("test.fail", "pending"): 1,
        ("test.fail", "cancelled"): 1,
        ("test.stop", "running"): 1,
        ("test.stop", "cancelled"): 1,
        ("other", "running"): 1,
        ("other", "completed"): 1,
    }
    assert samples[series("django_intents_rescued_total", kind="test.ok")] == 1
    delay = samples[series("django_intents_rescue_delay_seconds_sum", kind="test.ok")]
    assert 40 <= delay < 70
    # The webhook has no handler in this pool: it waits, and the gauges say so.
    assert samples[series("django_intents_pending", kind="other")] == 1
    assert samples[series("django_intents_oldest_due_age_seconds", kind="other")] >= 30
    assert samples[series("django_intents_pending", kind="test.ok")] == 0
    assert fetch(f"{base}/healthz") == (200, "ok\n")


# -- several processes -----------------------------------------------------------------------


def django_process(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = "import django\ndjango.setup()\n" + code
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.django_db
def test_multiprocess_dir_merges_counters_of_all_processes_and_keeps_the_gauges(
    tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    send = (
        "from django_intents.models import Intent\n"
        "from django_intents.signals import intents_transitioned\n"
        "intents_transitioned.send(sender=Intent, to='completed', kinds=['webhook'] * {n})\n"
    )
    for n in (3, 2):
        django_process(send.format(n=n), PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    Intent.objects.enqueue("webhook", "mp", "t")

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    response = metrics.metrics_view(RequestFactory().get("/metrics"))
    samples = parse(response.content.decode())
    assert samples[series("django_intents_transitions_total", kind="webhook", to="completed")] == 5
    assert samples[series("django_intents_pending", kind="webhook")] == 1


def test_importing_metrics_again_registers_nothing_twice():
    code = (
        "import importlib\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "import django_intents.observability.metrics as m\n"
        "kept = (m.TRANSITIONS, m.HANDLER_DURATION, m.RESCUED, m.RESCUE_DELAY, m.QUEUE)\n"
        "import django_intents.observability.gauges as g\n"
        "m.QUEUE._cached = lambda alias: g._Reading()\n"
        "importlib.reload(m)\n"
        "importlib.reload(m)\n"
        "m.connect()\n"
        "assert kept == (m.TRANSITIONS, m.HANDLER_DURATION, m.RESCUED, m.RESCUE_DELAY, m.QUEUE)\n"
        "assert m.BREAKER_TRANSITIONS is m.registered('django_intents_breaker_transitions')\n"
        "print(generate_latest(REGISTRY).decode())\n"
    )
    text = django_process(code).stdout
    for name, kind in TYPES.items():
        assert text.count(f"# TYPE {name} {kind}\n") == 1, name


# -- documentation that must not drift ------------------------------------------------------------


def test_docs_table_lists_every_metric():
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in TYPES:
        assert f"`{name}`" in text, name


def test_grafana_dashboard_queries_only_exported_metrics():
    dashboard = json.loads((ROOT / "docs" / "grafana" / "django-intents.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"django_intents_\w+", expr)}
    exported = {
        name + suffix
        for name, kind in TYPES.items()
        for suffix in (("_bucket", "_count", "_sum") if kind == "histogram" else ("",))
    }
    assert used, "the dashboard queries nothing"
    assert used <= exported, used - exported
    assert {"django_intents_pending", "django_intents_oldest_due_age_seconds"} <= used
    assert "django_intents_handler_duration_seconds_bucket" in used
