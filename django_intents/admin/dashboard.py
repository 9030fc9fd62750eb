"""The dashboard: the admin page an operator opens first, at ``intent/dashboard/``.

Per kind, the last hour (per minute) and the last day (per quarter hour) of
completions, failures, snoozes and cancellations, and the queue's depth, as
charts; the slowest kinds; the oldest due and the longest-running intents;
the paused kinds. The charts come from the ``Rollup`` table, which the pools
write (``observability/rollup.py``): one query of at most a day of minutes
per kind, whatever the intents table holds. The lists of intents are each
one bounded query along an index (the claim index, the lease index), so the
page costs the same number of queries, and about the same time, with a
hundred intents or five million.

Charts are SVG drawn here, on the server: no script, no library, nothing
fetched from elsewhere. Their colours are the admin's CSS variables
(``static/django_intents/dashboard.css``), so the dark theme recolours them;
every number is also in a ``<title>`` (the tooltip, and what a screen reader
reads) and in the table beside the chart. Everything shown is escaped
(``format_html``): kinds and targets come from the application's data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.db import router
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from django_intents.admin.humanize import relative, short_duration
from django_intents.models import Intent, PausedKind, Rollup
from django_intents.observability.rollup import FLUSH_INTERVAL, minute_of
from django_intents.rules.states import State
from django_intents.store.clock import server_now

if TYPE_CHECKING:
    from django.contrib import admin

HOUR = 60  # one-minute buckets in the hour chart
DAY = 96  # quarter-hour buckets in the day chart
QUARTER = timedelta(minutes=15)
LISTED = 10  # rows in each list of intents and of slow kinds
TARGET_PREVIEW = 60
OUTCOMES = ("completed", "failed", "snoozed", "cancelled")  # stacked bottom to top
CHART_WIDTH, CHART_HEIGHT = 240, 44


@dataclass
class Bucket:
    """One bar: the outcomes of its minutes, and the deepest queue sampled in them."""

    start: datetime
    completed: int = 0
    failed: int = 0
    snoozed: int = 0
    cancelled: int = 0
    due: int | None = None

    @property
    def finished(self) -> int:
        return self.completed + self.failed + self.snoozed + self.cancelled

    def add(
        self, completed: int, failed: int, snoozed: int, cancelled: int, due: int | None
    ) -> None:
        self.completed += completed
        self.failed += failed
        self.snoozed += snoozed
        self.cancelled += cancelled
        if due is not None:
            self.due = max(self.due or 0, due)


@dataclass
class Timing:
    attempts: int = 0
    seconds: float = 0.0
    longest: float = 0.0

    def add(self, attempts: int, seconds: float, longest: float) -> None:
        self.attempts += attempts
        self.seconds += seconds
        self.longest = max(self.longest, longest)

    @property
    def mean(self) -> float:
        return self.seconds / self.attempts if self.attempts else 0.0


@dataclass
class KindCharts:
    kind: str
    hour: list[Bucket]
    day: list[Bucket]
    paused: bool = False
    rows: int = 0  # rollup rows read: none, and the kind is listed only for its pause
    hour_timing: Timing = field(default_factory=Timing)
    day_timing: Timing = field(default_factory=Timing)

    def total(self, outcome: str, span: str = "hour") -> int:
        return sum(getattr(bucket, outcome) for bucket in getattr(self, span))

    @property
    def hour_totals(self) -> dict[str, int]:
        return {outcome: self.total(outcome) for outcome in OUTCOMES}

    @property
    def due_now(self) -> int | None:
        """The latest depth sampled in the last few minutes, if any."""
        for bucket in reversed(self.hour[-3:]):
            if bucket.due is not None:
                return bucket.due
        return None

    @property
    def hour_chart(self) -> SafeString:
        return outcome_chart(self.hour, "%H:%M")

    @property
    def day_chart(self) -> SafeString:
        return outcome_chart(self.day, "%H:%M")

    @property
    def hour_depth(self) -> SafeString:
        return depth_chart(self.hour, "%H:%M")

    @property
    def day_depth(self) -> SafeString:
        return depth_chart(self.day, "%H:%M")


def read_charts(now: datetime, using: str, paused: set[str]) -> list[KindCharts]:
    """Every kind with rollup rows in the last day (and every paused kind), by name."""
    end = minute_of(now) + timedelta(minutes=1)
    day_start, hour_start = end - DAY * QUARTER, end - timedelta(minutes=HOUR)
    rows = (
        Rollup.objects.using(using)
        .filter(minute__gte=day_start, minute__lt=end)
        .order_by()
        .values_list(
            "kind",
            "minute",
            "completed",
            "failed",
            "snoozed",
            "cancelled",
            "due",
            "attempts",
            "duration_sum",
            "duration_max",
        )
    )
    charts: dict[str, KindCharts] = {}

    def chart(kind: str) -> KindCharts:
        if kind not in charts:
            charts[kind] = KindCharts(
                kind,
                [Bucket(hour_start + timedelta(minutes=i)) for i in range(HOUR)],
                [Bucket(day_start + i * QUARTER) for i in range(DAY)],
                kind in paused,
            )
        return charts[kind]

    for (
        kind,
        minute,
        completed,
        failed,
        snoozed,
        cancelled,
        due,
        attempts,
        seconds,
        longest,
    ) in rows:
        counts = (completed, failed, snoozed, cancelled, due)
        kind_chart = chart(kind)
        kind_chart.rows += 1
        kind_chart.day[int((minute - day_start) / QUARTER)].add(*counts)
        kind_chart.day_timing.add(attempts, seconds, longest)
        if minute >= hour_start:
            kind_chart.hour[int((minute - hour_start) / timedelta(minutes=1))].add(*counts)
            kind_chart.hour_timing.add(attempts, seconds, longest)
    for kind in paused:
        chart(kind)
    return [charts[kind] for kind in sorted(charts)]


# -- SVG -----------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _label(bucket: Bucket, time_format: str) -> str:
    return timezone.localtime(bucket.start).strftime(time_format)


def _svg(body: SafeString, label: str, css: str) -> SafeString:
    return format_html(
        '<svg class="intents-chart {}" viewBox="0 0 {} {}" preserveAspectRatio="none" '
        'role="img" aria-label="{}"><line class="intents-chart-axis" x1="0" y1="{}" x2="{}" '
        'y2="{}"/>{}</svg>',
        css,
        CHART_WIDTH,
        CHART_HEIGHT,
        label,
        CHART_HEIGHT,
        CHART_WIDTH,
        CHART_HEIGHT,
        body,
    )


def outcome_chart(buckets: Sequence[Bucket], time_format: str) -> SafeString:
    """Stacked bars of each bucket's outcomes, scaled to the busiest bucket."""
    peak = max((bucket.finished for bucket in buckets), default=0) or 1
    step = CHART_WIDTH / len(buckets)
    bars = []
    for index, bucket in enumerate(buckets):
        if not bucket.finished:
            continue
        title = _(
            "%(time)s: %(completed)d completed, %(failed)d failed, %(snoozed)d snoozed, "
            "%(cancelled)d cancelled"
        ) % {
            "time": _label(bucket, time_format),
            **{outcome: getattr(bucket, outcome) for outcome in OUTCOMES},
        }
        top = float(CHART_HEIGHT)
        rects = []
        for outcome in OUTCOMES:
            height = getattr(bucket, outcome) / peak * CHART_HEIGHT
            if not height:
                continue
            top -= height
            rects.append(
                (
                    outcome,
                    _number(index * step),
                    _number(top),
                    _number(max(step - 0.5, 0.5)),
                    _number(height),
                )
            )
        bars.append(
            format_html(
                "<g><title>{}</title>{}</g>",
                title,
                format_html_join(
                    "",
                    '<rect class="intents-{}" x="{}" y="{}" width="{}" height="{}"/>',
                    rects,
                ),
            )
        )
    body = format_html_join("", "{}", ((bar,) for bar in bars))
    total = sum(bucket.finished for bucket in buckets)
    return _svg(body, _("%(n)d attempts finished") % {"n": total}, "intents-chart-outcomes")


def depth_chart(buckets: Sequence[Bucket], time_format: str) -> SafeString:
    """The deepest due queue sampled in each bucket, as bars; unsampled buckets are blank."""
    peak = max((bucket.due or 0 for bucket in buckets), default=0) or 1
    step = CHART_WIDTH / len(buckets)
    bars = [
        (
            _("%(time)s: %(due)d due") % {"time": _label(bucket, time_format), "due": bucket.due},
            _number(index * step),
            _number(CHART_HEIGHT - bucket.due / peak * CHART_HEIGHT),
            _number(max(step - 0.5, 0.5)),
            _number(bucket.due / peak * CHART_HEIGHT),
        )
        for index, bucket in enumerate(buckets)
        if bucket.due
    ]
    body = format_html_join(
        "",
        '<g><title>{}</title><rect class="intents-due" x="{}" y="{}" width="{}" height="{}"/></g>',
        bars,
    )
    deepest = max((bucket.due or 0 for bucket in buckets), default=0)
    return _svg(body, _("at most %(n)d due") % {"n": deepest}, "intents-chart-depth")


# -- the lists -----------------------------------------------------------------


@dataclass(frozen=True)
class Listed:
    intent: Intent
    since: datetime  # due since, or running since
    age: str

    @property
    def target(self) -> str:
        return Truncator(self.intent.target).chars(TARGET_PREVIEW)


FIELDS = ("id", "kind", "target", "state", "attempts", "next_at", "claim_until", "updated_at")


def oldest_due(now: datetime, using: str) -> list[Listed]:
    """The intents that have waited longest to be claimed: pending ones past ``next_at``
    (along the claim index) and running ones whose lease ran out (the lease index)."""
    rows = Intent.objects.using(using).only(*FIELDS)
    pending = rows.filter(state=State.PENDING, next_at__lte=now).order_by("next_at")[:LISTED]
    expired = rows.filter(state=State.RUNNING, claim_until__lte=now).order_by("claim_until")
    found = [(intent.next_at, intent) for intent in pending]
    found += [(intent.claim_until or now, intent) for intent in expired[:LISTED]]
    found.sort(key=lambda pair: pair[0])
    return [Listed(intent, since, relative(since, now)) for since, intent in found[:LISTED]]


def longest_running(now: datetime, using: str) -> list[Listed]:
    """The running intents claimed longest ago (their ``updated_at`` is the claim's time);
    running intents are at most the pools' slots, read along the lease index."""
    rows = (
        Intent.objects.using(using)
        .only(*FIELDS)
        .filter(state=State.RUNNING, claim_until__gt=now)
        .order_by("updated_at")[:LISTED]
    )
    return [
        Listed(intent, intent.updated_at, short_duration((now - intent.updated_at).total_seconds()))
        for intent in rows
    ]


# -- the view ------------------------------------------------------------------


def dashboard_view(modeladmin: admin.ModelAdmin[Intent], request: HttpRequest) -> HttpResponse:
    """The page, for users who may view intents."""
    if not modeladmin.has_view_permission(request):
        raise PermissionDenied
    using = router.db_for_read(Intent)
    now = server_now(using)
    pauses = list(PausedKind.objects.using(using).order_by("kind"))
    charts = read_charts(now, using, {pause.kind for pause in pauses})
    slowest = sorted(
        (chart for chart in charts if chart.day_timing.attempts),
        key=lambda chart: chart.day_timing.mean,
        reverse=True,
    )[:LISTED]
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.opts,
        "title": _("Intents dashboard"),
        "now": now,
        "charts": charts,
        "has_data": any(chart.rows for chart in charts),
        "slowest": [
            {
                "kind": chart.kind,
                "attempts": chart.day_timing.attempts,
                "mean": _seconds(chart.day_timing.mean),
                "longest": _seconds(chart.day_timing.longest),
                "hour_mean": _seconds(chart.hour_timing.mean)
                if chart.hour_timing.attempts
                else "—",
            }
            for chart in slowest
        ],
        "oldest_due": oldest_due(now, using),
        "longest_running": longest_running(now, using),
        "paused": [(pause.kind, relative(pause.paused_at, now)) for pause in pauses],
        "flush_interval": int(FLUSH_INTERVAL),
        "outcomes": OUTCOMES,
    }
    return TemplateResponse(request, "admin/django_intents/intent/dashboard.html", context)


def _seconds(value: float) -> str:
    if value < 1:
        return _("%(n)d ms") % {"n": round(value * 1000)}
    return _("%(n).1f s") % {"n": value}


def dashboard_url(modeladmin: admin.ModelAdmin[Intent]) -> URLPattern:
    """The page's URL, for ``IntentAdmin.get_urls``: named ``<app>_<model>_dashboard``."""
    opts = modeladmin.opts
    view: Callable[[HttpRequest], HttpResponse] = partial(dashboard_view, modeladmin)
    return path(
        "dashboard/",
        modeladmin.admin_site.admin_view(view),
        name=f"{opts.app_label}_{opts.model_name}_dashboard",
    )
