"""OpenTelemetry spans for enqueue and for every attempt, with the ``otel`` extra.

An intent crosses a process boundary (and usually hours): the request that
enqueued it and the attempts that ran it are different traces. Following
OpenTelemetry's messaging semantic conventions, ``enqueue`` is a ``send``
span (PRODUCER) in the caller's trace, and each attempt is a ``process`` span
(CONSUMER) that starts its own trace and links to the send: the link is the
send span's W3C trace context, stored with the intent in ``trace_context``.

Without opentelemetry-api installed nothing here imports it and nothing is
stored. With the API but no provider configured (the API's proxy or no-op
provider), no span is made at all: a no-op span per attempt cost a tenth of
a SQLite drain's loop, for a context that is invalid and never stored.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode

    INSTALLED = True
except ImportError:  # the otel extra is not installed: nothing below touches those names
    INSTALLED = False

SYSTEM = "django_intents"
# ``Intent.trace_context``'s length: a long ``tracestate`` is dropped, the
# ``traceparent`` alone (55 characters) still makes the link.
MAX_CONTEXT = 1024
NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
# The handler failed. A fenced attempt is not a failure: its result was dropped.
FAILED = frozenset({"error", "stopped"})


def enabled() -> bool:
    return INSTALLED


def tracer() -> Any | None:
    """The tracer of the globally configured provider; ``None`` while no provider is
    configured, the API's default (tests hand in their own)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(SYSTEM)


def sending(rows: Sequence[dict[str, Any]]) -> contextlib.AbstractContextManager[None]:
    """A ``send`` span around the insert of ``rows``; each row gets its ``trace_context``.

    Without the extra, one shared no-op: enqueue pays no generator for it.
    """
    if not INSTALLED or not rows or (spans := tracer()) is None:
        return NOTHING
    return _sending(spans, rows)


def processing(claim: Any) -> contextlib.AbstractContextManager[None]:
    """A ``process`` span around one attempt (an ``execution.Claim``, which imports
    this module), linked to the intent's send span; without the extra, a no-op."""
    if not INSTALLED or (spans := tracer()) is None:
        return NOTHING
    return _processing(spans, claim)


@contextlib.contextmanager
def _sending(spans: Any, rows: Sequence[dict[str, Any]]) -> Iterator[None]:
    kinds = {row["kind"] for row in rows}
    destination = next(iter(kinds)) if len(kinds) == 1 else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
    }
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    if len(rows) == 1:
        attributes["messaging.message.id"] = rows[0]["id"]
    else:
        attributes["messaging.batch.message_count"] = len(rows)
    name = f"send {destination}" if destination is not None else "send"
    with spans.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        context = json.dumps(carrier, sort_keys=True) if carrier else ""
        if len(context) > MAX_CONTEXT:
            context = json.dumps({"traceparent": carrier.get("traceparent", "")})
        for row in rows:
            row["trace_context"] = context
        yield


@contextlib.contextmanager
def _processing(spans: Any, claim: Any) -> Iterator[None]:
    intent = claim.intent
    links = []
    if intent.trace_context:
        with contextlib.suppress(ValueError, TypeError):
            carrier = json.loads(intent.trace_context)
            sent = trace.get_current_span(propagate.extract(carrier)).get_span_context()
            if sent.is_valid:
                links.append(Link(sent))
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "attempt",
        "messaging.destination.name": intent.kind,
        "messaging.message.id": intent.id,
        "django_intents.attempt": intent.attempts,
    }
    # A new trace, not a child of whatever context the worker thread holds.
    with spans.start_as_current_span(
        f"process {intent.kind}",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    ) as span:
        yield
        outcome = claim.outcome.value if claim.outcome is not None else "unknown"
        span.set_attribute("django_intents.outcome", outcome)
        if outcome in FAILED:
            span.set_status(StatusCode.ERROR, claim.cause or outcome)
