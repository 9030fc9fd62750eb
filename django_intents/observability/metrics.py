"""Prometheus metrics: defined once here, fed by signal receivers.

Counters and histograms live on ``prometheus_client``'s default registry, so
django-prometheus's ``/metrics`` view exports them from the web process and
:func:`serve` exports them from a worker. The manager and the worker only send
signals; the receivers below turn them into samples, so no hot path does any
bookkeeping of its own.

The gauges describe the table, not the process: they are read when scraped
(``gauges.py``), so enqueue, claim and complete never pay for a ``COUNT``.

The ``kind`` label is bounded: kinds outside ``handlers.metric_kinds()`` are
reported as ``other``, so a typo or a per-tenant kind cannot explode the number
of series. That set is ``INTENTS["METRIC_KINDS"]``, or by default the kinds the
project declares (its handlers, ``EXTERNAL_KINDS`` and the django.tasks kind),
so the project's own kinds keep their names without any configuration.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, TypeVar, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    make_wsgi_app,
    multiprocess,
)

from django_intents.conf import get_settings
from django_intents.handlers import metric_kinds
from django_intents.observability import log as logger
from django_intents.observability.gauges import OTHER, QUEUE, registered
from django_intents.rules.states import State
from django_intents.rules.targets import TargetHealth
from django_intents.signals import (
    Outcome,
    attempt_finished,
    intents_rescued,
    intents_transitioned,
    target_state_changed,
)

# The values of the ``to`` and ``outcome`` labels, as plain strings.
STATES = tuple(State.values)
OUTCOMES = tuple(outcome.value for outcome in Outcome)
# Where a circuit breaker moves: the ``to`` label of the breaker's counter.
BREAKER_STATES = (TargetHealth.OPEN, TargetHealth.HALF_OPEN, TargetHealth.CLOSED)
DEFAULT_ADDR = "127.0.0.1"

# Handlers range from a few milliseconds (a push) to the whole lease (a slow webhook).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A rescue comes one poll after expiry with a busy pool, or hours late with none.
RESCUE_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)

_C = TypeVar("_C", Counter, Histogram)


def _define(
    factory: type[_C], name: str, documentation: str, labels: tuple[str, ...], **kw: Any
) -> _C:
    """Return the collector registered as ``name``, creating it on the first import only.

    Reusing the registered collector (``gauges.registered``) also keeps the
    receivers connected before a reload feeding the series that are exported.
    """
    existing = registered(name)
    if existing is not None:
        return cast(_C, existing)
    return factory(name, documentation, labels, **kw)


HANDLER_DURATION = _define(
    Histogram,
    "django_intents_handler_duration_seconds",
    "Time a handler attempt took, per kind and outcome "
    "(success, error, stopped, snoozed, fenced, timeout).",
    ("kind", "outcome", "database"),
    buckets=DURATION_BUCKETS,
)
TRANSITIONS = _define(
    Counter,
    "django_intents_transitions_total",
    "State changes made by this process, per kind and new state, administrative ones included.",
    ("kind", "to", "database"),
)
RESCUED = _define(
    Counter,
    "django_intents_rescued_total",
    "Claims that took over an expired lease (crash or stall recovery), per kind.",
    ("kind", "database"),
)
RESCUE_DELAY = _define(
    Histogram,
    "django_intents_rescue_delay_seconds",
    "Seconds from a lease's expiry to the claim that rescued its intent, per kind.",
    ("kind", "database"),
    buckets=RESCUE_BUCKETS,
)

BREAKER_TRANSITIONS = _define(
    Counter,
    "django_intents_breaker_transitions_total",
    "Circuit breaker moves made by this process, per kind and new state "
    "(open, half_open, closed from open or half_open).",
    ("kind", "to", "database"),
)


def kind_label(kind: str) -> str:
    """The ``kind`` label for ``kind``: its name if :func:`metric_kinds` has it, else ``other``."""
    return kind if kind in metric_kinds() else OTHER


def database_label(database: str | None) -> str:
    """The ``database`` label: the alias a signal names, else the routers' one for
    ``Intent`` (a sender that names none, from before issue 41)."""
    if database:
        return database
    return str(router.db_for_write(apps.get_model("django_intents", "Intent")))


def databases() -> tuple[str, ...]:
    """The databases whose series exist from start-up: ``INTENTS["DATABASES"]`` or the one."""
    return get_settings().databases or (database_label(None),)


# The duration series of each label, outcome and database, as ``labels()``
# returns it: every attempt observes one, and ``labels()`` checks and locks on
# every call. Keyed by the label, not the kind, so it holds no more than the
# series do.
_durations: dict[tuple[str, str, str], Any] = {}


def _duration(kind: str, outcome: str, database: str) -> Any:
    key = (kind_label(kind), outcome, database)
    series = _durations.get(key)
    if series is None:
        series = _durations[key] = HANDLER_DURATION.labels(
            kind=key[0], outcome=outcome, database=database
        )
    return series


# -- receivers -----------------------------------------------------------------


def _on_transitioned(
    sender: Any, *, to: str, kinds: Iterable[str], database: str | None = None, **kwargs: Any
) -> None:
    if to not in STATES:
        raise ValueError(f"intents_transitioned: to={to!r} is not one of {STATES}")
    # enqueue_many sends thousands of kinds at once: one increment per label.
    known, alias = metric_kinds(), database_label(database)
    for label, count in Tally(kind if kind in known else OTHER for kind in kinds).items():
        TRANSITIONS.labels(kind=label, to=to, database=alias).inc(count)


def _on_rescued(
    sender: Any,
    *,
    rescued: Iterable[tuple[str, float]],
    database: str | None = None,
    **kwargs: Any,
) -> None:
    alias = database_label(database)
    for kind, delay in rescued:
        label = kind_label(kind)
        RESCUED.labels(kind=label, database=alias).inc()
        RESCUE_DELAY.labels(kind=label, database=alias).observe(max(delay, 0.0))


def _on_attempt_finished(
    sender: Any,
    *,
    kind: str,
    outcome: str,
    duration: float,
    database: str | None = None,
    **kwargs: Any,
) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"attempt_finished: outcome={outcome!r} is not one of {OUTCOMES}")
    _duration(kind, outcome, database_label(database)).observe(duration)


def _on_target_state_changed(
    sender: Any,
    *,
    kind: str,
    state: str,
    previous: str,
    database: str | None = None,
    **kwargs: Any,
) -> None:
    """Count a breaker's moves; a hold, or a closing that was no breaker's, is none."""
    if state == previous:
        return
    breaker = (TargetHealth.OPEN, TargetHealth.HALF_OPEN)
    if state in breaker or (state == TargetHealth.CLOSED and previous in breaker):
        alias = database_label(database)
        BREAKER_TRANSITIONS.labels(kind=kind_label(kind), to=str(state), database=alias).inc()


def connect() -> None:
    """Connect the receivers and pre-create the series of the configured kinds.

    Called from ``AppConfig.ready``; calling it again is harmless. Until a
    receiver is connected the manager does not even build its signals.
    """
    intents_transitioned.connect(_on_transitioned, dispatch_uid="django_intents.metrics.moved")
    intents_rescued.connect(_on_rescued, dispatch_uid="django_intents.metrics.rescued")
    attempt_finished.connect(_on_attempt_finished, dispatch_uid="django_intents.metrics.attempt")
    target_state_changed.connect(
        _on_target_state_changed, dispatch_uid="django_intents.metrics.breaker"
    )
    try:
        # Imports the apps' handlers modules (as admin.autodiscover does in ready()).
        kinds = metric_kinds()
    except ImproperlyConfigured:
        return  # the system check reports the bad setting or handler; nothing to pre-create
    precreate(sorted(kinds))


def precreate(kinds: Iterable[str]) -> None:
    """Create every child of ``kinds`` and ``other`` at zero.

    A series that appears only on its first increment makes ``rate()`` and
    ``increase()`` miss that increment; existing at zero from start-up, it does not.
    """
    for database in databases():
        for kind in (*kinds, OTHER):
            for to in STATES:
                TRANSITIONS.labels(kind=kind, to=to, database=database)
            for outcome in OUTCOMES:
                HANDLER_DURATION.labels(kind=kind, outcome=outcome, database=database)
            RESCUED.labels(kind=kind, database=database)
            RESCUE_DELAY.labels(kind=kind, database=database)
            for state in BREAKER_STATES:
                BREAKER_TRANSITIONS.labels(kind=kind, to=state.value, database=database)


# -- exposition --------------------------------------------------------------------


def multiprocess_mode() -> bool:
    """Whether ``prometheus_client`` keeps values in ``PROMETHEUS_MULTIPROC_DIR`` files."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def export_registry() -> CollectorRegistry:
    """The registry to expose: the default one, or every process's files plus the gauges.

    In multiprocess mode the counters of all processes are merged from their
    files, but a custom collector writes no file: the queue gauges, which read
    the database and so are the same from any process, are added here.
    """
    if not multiprocess_mode():
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(QUEUE)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` for the web process; like django-prometheus's view, plus the queue
    gauges under ``PROMETHEUS_MULTIPROC_DIR`` (where that view leaves them out)."""
    return HttpResponse(generate_latest(export_registry()), content_type=CONTENT_TYPE_LATEST)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung scraper must not keep the worker from exiting


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        """Scrapes every few seconds would drown the worker's own log."""


class MetricsServer:
    """A worker's HTTP endpoint (``/metrics``, ``/healthz``), served by a daemon thread."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _is_healthy(healthy: Callable[[], bool]) -> bool:
    try:
        return bool(healthy())
    except Exception:
        logger.exception("django-intents: the health check raised; answering 503")
        return False


def _application(healthy: Callable[[], bool]) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(export_registry())

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return cast(Iterable[bytes], metrics_app(environ, start_response))
            if path == "/healthz":
                ok = _is_healthy(healthy)
                status, body = (
                    ("200 OK", b"ok\n") if ok else ("503 Service Unavailable", b"unhealthy\n")
                )
            else:
                status, body = "404 Not Found", b"not found: try /metrics or /healthz\n"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [body]
        finally:
            # Every request has a thread of its own; close the database
            # connection the gauges opened in it rather than leak one per scrape.
            connections.close_all()

    return application


def serve(
    addr: str = DEFAULT_ADDR, port: int = 0, healthy: Callable[[], bool] = lambda: True
) -> MetricsServer:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` from a daemon thread.

    ``/healthz`` answers 200 ``ok`` while ``healthy()`` returns ``True`` and 503
    otherwise. The default address is loopback: exposing a worker's metrics is a
    choice (``--metrics-addr 0.0.0.0``). Port 0 picks a free port; the returned
    server's ``port`` says which.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type("MetricsHTTPServer", (_Server,), {"address_family": family})
    httpd: WSGIServer = make_server(
        str(sockaddr[0]), port, _application(healthy), server_class, handler_class=_QuietHandler
    )
    thread = threading.Thread(
        target=httpd.serve_forever, name="django-intents-metrics", daemon=True
    )
    thread.start()
    return MetricsServer(httpd, thread)
