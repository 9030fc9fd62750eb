"""OpenTelemetry spans, the ``otel`` extra (``django_intents/tracing.py``).

Following the messaging semantic conventions: ``enqueue`` is a ``send`` span
in the caller's trace; every attempt is a ``process`` span in a trace of its
own, linked to the send through the context stored with the intent. The
spans are read back with the SDK's in-memory exporter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_intents import tracing
from django_intents.models import Intent
from django_intents.worker.pool import WorkerPool

from .conftest import external_kinds
from .workerutil import ROOT

pytestmark = pytest.mark.django_db(transaction=True)
KIND = "traced.job"


@pytest.fixture
def spans(monkeypatch) -> InMemorySpanExporter:
    """A provider of this test's own: the global one stays the API's no-op."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", lambda: provider.get_tracer("tests"))
    with external_kinds(KIND):
        yield exporter


def drain(handler: Any) -> None:
    pool = WorkerPool(handlers={KIND: handler}, workers=1, drain=True, handle_signals=False)
    assert pool.run() == 0


def named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_enqueue_is_a_send_span_in_the_callers_trace_and_stores_its_context(spans):
    with tracing.tracer().start_as_current_span("POST /orders") as request:
        id = Intent.objects.enqueue(KIND, "order-1", "https://partner.example/hook")
    [send] = named(spans, f"send {KIND}")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.context.trace_id == request.get_span_context().trace_id
    assert dict(send.attributes) == {
        "messaging.system": "django_intents",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": KIND,
        "messaging.message.id": id,
    }
    stored = json.loads(Intent.objects.get(id=id).trace_context)
    assert stored["traceparent"].startswith(
        f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-"
    )


def test_enqueue_many_is_one_send_span_for_the_batch(spans):
    ids = Intent.objects.enqueue_many(
        [{"kind": KIND, "event_id": f"e{i}", "target": "t"} for i in range(3)]
    )
    [send] = named(spans, f"send {KIND}")
    assert send.attributes["messaging.batch.message_count"] == 3
    contexts = set(Intent.objects.filter(id__in=ids).values_list("trace_context", flat=True))
    assert len(contexts) == 1 and f"{send.context.span_id:016x}" in contexts.pop()


def test_each_attempt_is_a_process_span_linked_to_the_send(spans):
    id = Intent.objects.enqueue(KIND, "order-2", "t")
    [send] = named(spans, f"send {KIND}")
    drain(lambda intent, attempt: None)

    [process] = named(spans, f"process {KIND}")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None and process.context.trace_id != send.context.trace_id
    [link] = process.links
    assert (link.context.trace_id, link.context.span_id) == (
        send.context.trace_id,
        send.context.span_id,
    )
    assert process.attributes["messaging.message.id"] == id
    assert process.attributes["messaging.destination.name"] == KIND
    assert process.attributes["django_intents.attempt"] == 1
    assert process.attributes["django_intents.outcome"] == "success"
    assert process.status.status_code is StatusCode.UNSET
    assert Intent.objects.get(id=id).state == "completed"


def test_a_failing_attempt_is_an_error_span_and_the_intent_is_retried(spans):
    id = Intent.objects.enqueue(KIND, "order-3", "t")

    def fail(intent: Any, attempt: Any) -> None:
        raise ValueError("partner said 500")

    pool = WorkerPool(handlers={KIND: fail}, workers=1, drain=True, handle_signals=False)
    assert pool.run() == 0
    [process] = named(spans, f"process {KIND}")
    assert process.attributes["django_intents.outcome"] == "error"
    assert process.status.status_code is StatusCode.ERROR
    assert "partner said 500" in process.status.description
    stored = Intent.objects.get(id=id)
    assert (stored.state, stored.attempts) == ("pending", 1)


async def _async_ok(intent: Any, attempt: Any) -> None:
    return None


def test_an_async_attempt_is_traced_the_same_way(spans):
    Intent.objects.enqueue(KIND, "order-4", "t")
    drain(_async_ok)
    [process] = named(spans, f"process {KIND}")
    assert process.attributes["django_intents.outcome"] == "success"
    assert len(process.links) == 1


def test_without_a_configured_provider_nothing_is_stored():
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with external_kinds(KIND):
        id = Intent.objects.enqueue(KIND, "untraced", "t")
    assert Intent.objects.get(id=id).trace_context == ""


def test_without_a_configured_provider_no_span_is_made_at_all(monkeypatch):
    # A no-op span per attempt cost a tenth of a SQLite drain's loop: none is made.
    assert tracing.tracer() is None
    made = []
    monkeypatch.setattr(tracing, "_processing", lambda *args: made.append(args))
    monkeypatch.setattr(tracing, "_sending", lambda *args: made.append(args))
    with external_kinds(KIND):
        Intent.objects.enqueue(KIND, "untraced-2", "t")
        drain(lambda intent, attempt: None)
    assert made == []
    assert Intent.objects.get(event_id="untraced-2").state == "completed"
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.NoOpTracerProvider())
    assert tracing.tracer() is None
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: TracerProvider())
    assert tracing.tracer() is not None


def test_without_the_extra_nothing_is_imported_and_nothing_is_stored():
    # A process where opentelemetry cannot be imported, as without the extra.
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import django; django.setup()\n"
        "from django_intents import tracing\n"
        "from django_intents.models import Intent\n"
        "assert not tracing.enabled()\n"
        "id = Intent.objects.enqueue('test.ok', 'no-otel', 't')\n"
        "assert Intent.objects.get(id=id).trace_context == ''\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry') and sys.modules[m]]\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_long_tracestate_is_dropped_and_the_link_kept(spans, monkeypatch):
    inject = tracing.propagate.inject

    def with_long_state(carrier: dict[str, str]) -> None:
        inject(carrier)
        carrier["tracestate"] = "vendor=" + "x" * 2000

    monkeypatch.setattr(tracing.propagate, "inject", with_long_state)
    id = Intent.objects.enqueue(KIND, "long-state", "t")
    stored = json.loads(Intent.objects.get(id=id).trace_context)
    [send] = named(spans, f"send {KIND}")
    assert list(stored) == ["traceparent"]
    assert f"{send.context.span_id:016x}" in stored["traceparent"]
