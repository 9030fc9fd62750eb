"""The queue gauges, read from the database when scraped.

``django_intents_pending``, ``django_intents_oldest_due_age_seconds``,
``django_intents_oldest_running_seconds``, ``django_intents_limited`` and
``django_intents_paused`` describe the table, not the process: they come from
one read of the backlog, cached for ``INTENTS["GAUGE_CACHE"]`` seconds, so
enqueue, claim and complete never pay for a ``COUNT``. ``django_intents_targets``
(how many targets are held, open, half-open or failing, per kind; never a
label per target) is one more grouped query of the small ``TargetState``
table, read and cached with the backlog. Their ``kind`` label is
bounded as every other metric's is (``metrics.py``): kinds outside
``handlers.metric_kinds()`` are ``other``.

The read is exact (``backlog.read_backlog``, one grouped query) while at most
``EXACT_UP_TO`` intents are pending or running. Once a read finds more, the
next ones take the planner's estimates instead (``estimate.estimate_backlog``:
a few queries that each cost what they return, not what the queue holds),
until an estimate falls back under the bound. Past it, pending counts are
estimates, the ages stay exact, and ``django_intents_limited`` is left out:
what a limit holds back is not known without counting. SQLite keeps no
estimates: there the read is always exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from django.core.signals import setting_changed
from django.db import DatabaseError, connections, router
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from django_intents.conf import get_settings
from django_intents.handlers import metric_kinds
from django_intents.models import Intent
from django_intents.observability import log as logger
from django_intents.observability.backlog import Backlog, KindBacklog, read_backlog
from django_intents.observability.estimate import estimate_backlog
from django_intents.rules.targets import TargetHealth
from django_intents.store import backend_for
from django_intents.store.admin import kinds as present_kinds
from django_intents.store.clock import server_now
from django_intents.store.targetrows import count_target_rows

OTHER = "other"
PENDING = "django_intents_pending"
OLDEST_DUE_AGE = "django_intents_oldest_due_age_seconds"
OLDEST_RUNNING = "django_intents_oldest_running_seconds"
LIMITED = "django_intents_limited"
PAUSED = "django_intents_paused"
TARGETS = "django_intents_targets"
TARGET_STATES = tuple(TargetHealth)
# Pending or running intents the gauges count exactly; past this, estimates.
EXACT_UP_TO = 10_000
GAUGES = (
    (
        PENDING,
        "Intents in state pending (due or scheduled), per kind; read from the database: "
        f"exact up to {EXACT_UP_TO:,} pending or running intents, the database planner's "
        "estimate past that (PostgreSQL, MariaDB/MySQL).",
    ),
    (
        OLDEST_DUE_AGE,
        "Seconds the oldest due intent has waited to be claimed (since next_at, or since its "
        "lease expired), per kind; 0 when nothing is due.",
    ),
    (
        OLDEST_RUNNING,
        "Seconds the longest-running intent has been in its attempt, per kind, counted from "
        "when that attempt became due (its next_at: any wait for a worker included); "
        "0 when nothing runs.",
    ),
    (
        LIMITED,
        "Due intents that INTENTS['LIMITS'] keeps from running now, per kind; absent while "
        "the pending count is an estimate.",
    ),
    (PAUSED, "1 while the kind is paused (no claim takes it), else 0; other: any such kind."),
)


@dataclass
class _Reading:
    """One database's cached rows (``QueueCollector``)."""

    rows: list[KindBacklog] = field(default_factory=list)
    targets: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, state): targets
    exact: bool = True  # False: the rows are estimates (``estimate_backlog``)
    estimating: bool = False  # the last read found more than EXACT_UP_TO
    read_at: float | None = None


class QueueCollector(Collector):
    """Exports the queue gauges from the backlog rows, cached, per database.

    The database rows are cached for ``GAUGE_CACHE`` seconds: a scrape inside
    that window runs no query. Ages are computed from the cached times at each
    scrape, so a stuck queue's age keeps rising between refreshes. Every
    series carries the ``database`` it was read from: the queue's databases
    (``INTENTS["DATABASES"]``), else those a worker serves
    (``run_intent_workers --database``), else the routers' one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[str, _Reading] = {}
        self._using: tuple[str, ...] = ()

    def read_from(self, *using: str) -> None:
        """Read the queue on ``using`` from now on (``run_intent_workers --database``)."""
        with self._lock:
            self._using, self._readings = tuple(using), {}

    def expire(self) -> None:
        """Let the next scrape read every database again, as after ``GAUGE_CACHE``, keeping
        whether each read estimates."""
        with self._lock:
            for reading in self._readings.values():
                reading.read_at = None

    def invalidate(self) -> None:
        """Forget the cached rows, so the next scrape reads the database, exactly."""
        with self._lock:
            self._readings = {}

    def databases(self) -> tuple[str, ...]:
        listed = get_settings().databases
        if listed is not None:
            return listed
        return self._using or (router.db_for_read(Intent),)

    def describe(self) -> Iterator[Metric]:
        # With describe(), registering does not call collect(): no query at import.
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        labels = ["kind", "database"]
        families = [GaugeMetricFamily(name, text, labels=labels) for name, text in GAUGES]
        text = (
            "Targets of the kind per state: held (by hand or by Retry(hold_target=True)), "
            "open or half_open (circuit breaker), closed (counting consecutive failures)."
        )
        return [*families, GaugeMetricFamily(TARGETS, text, labels=["kind", "state", "database"])]

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for alias in self.databases():
            try:
                reading = self._cached(alias)
                now = server_now(get_settings().read_alias(alias))
            except DatabaseError:
                # One failing database must not take the others, or the counters,
                # down with it: the scrape still answers, without its gauges.
                logger.warning(
                    "django-intents: could not read the queue on %r for metrics",
                    alias,
                    exc_info=True,
                )
                continue
            self._add(families, alias, reading, now)
        yield from families

    def _add(
        self, families: list[GaugeMetricFamily], alias: str, reading: _Reading, now: Any
    ) -> None:
        pending, oldest, running, limited, paused, targets = families
        kinds = metric_kinds()
        labels = (*sorted(kinds), OTHER)  # a set: sorted, so every scrape lists them alike
        counts = dict.fromkeys(labels, 0)
        held = dict.fromkeys(labels, 0)
        stopped = dict.fromkeys(labels, 0)
        ages = dict.fromkeys(labels, 0.0)
        runs = dict.fromkeys(labels, 0.0)
        for row in reading.rows:
            label = row.kind if row.kind in kinds else OTHER
            counts[label] += row.pending
            held[label] += row.limited
            stopped[label] |= row.paused
            if row.oldest_due is not None:
                ages[label] = max(ages[label], (now - row.oldest_due).total_seconds())
            if row.oldest_running is not None:
                since = (now - row.oldest_running).total_seconds()
                runs[label] = max(runs[label], since)
        for label in counts:
            pending.add_metric([label, alias], counts[label])
            oldest.add_metric([label, alias], ages[label])
            running.add_metric([label, alias], runs[label])
            if reading.exact:
                limited.add_metric([label, alias], held[label])
            paused.add_metric([label, alias], stopped[label])
        per_state: dict[tuple[str, str], int] = {
            (label, state.value): 0 for label in labels for state in TARGET_STATES
        }
        for (kind, state), count in reading.targets.items():
            per_state[kind if kind in kinds else OTHER, state] += count
        for (label, state), count in per_state.items():
            targets.add_metric([label, state, alias], count)

    def _cached(self, alias: str) -> _Reading:
        """The backlog's rows per kind on ``alias``, whether they are exact, and its
        targets per state."""
        # Concurrent scrapes wait for the one that is reading instead of all querying.
        with self._lock:
            reading = self._readings.setdefault(alias, _Reading())
            ttl = get_settings().gauge_cache
            fresh = reading.read_at is not None and time.monotonic() - reading.read_at < ttl
            if not fresh:
                # From the replica, when READ_DATABASE names one: the series keep the
                # queue's alias, the primary answers no scrape.
                source = get_settings().read_alias(alias)
                backlog = self._read(source, reading)
                reading.targets = count_target_rows(source)
                reading.rows, reading.exact = backlog.kinds, backlog.exact
                reading.read_at = time.monotonic()
            return reading

    def _read(self, alias: str, reading: _Reading) -> Backlog:
        """Exact while the last read found at most ``EXACT_UP_TO`` active intents, else
        estimated; exact again once an estimate is back under the bound."""
        if reading.estimating:
            kinds = present_kinds(backend_for(connections[alias], Intent))
            estimated = estimate_backlog(server_now(alias), kinds, alias)
            if estimated is not None and estimated.active > EXACT_UP_TO:
                return estimated
        backlog = read_backlog(using=alias)
        reading.estimating = backlog.active > EXACT_UP_TO
        return backlog


def registered(name: str) -> Collector | None:
    """The collector the default registry holds under ``name``, if any.

    Importing a module of metrics again (``importlib.reload`` in a test, a
    module reached under two names) must find its collectors, not register
    them twice, which the registry refuses.
    """
    return REGISTRY._names_to_collectors.get(name)  # private, but the only lookup there is


def _queue_collector() -> QueueCollector:
    existing = registered(PENDING)
    if existing is not None:
        return cast(QueueCollector, existing)
    collector = QueueCollector()
    REGISTRY.register(collector)
    return collector


QUEUE = _queue_collector()


def _forget_cached_queue(*, setting: str, **kwargs: Any) -> None:
    if setting == "INTENTS":
        QUEUE.invalidate()


setting_changed.connect(_forget_cached_queue, dispatch_uid="django_intents.metrics.settings")
