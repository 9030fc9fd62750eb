"""The dashboard: the admin page an operator opens first, at ``intent/dashboard/``.

Per kind, the last hour (per minute) and the last day (per quarter hour) of
completions, failures, snoozes and cancellations, and the queue's depth, as
charts; the slowest kinds; the oldest due and the longest-running intents;
the paused kinds; the targets that are not plainly healthy (the first rows of
the Targets page, ``targets.py``). The charts come from the ``Rollup`` table, which the pools
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

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.db.models import Max, Sum
from django.db.models.functions import ExtractMinute, Floor, TruncHour
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from django_intents.admin.databases import counted, replica, shown
from django_intents.admin.humanize import relative, short_duration
from django_intents.admin.targets import listing as target_listing
from django_intents.admin.targets import per_state as targets_per_state
from django_intents.models import Intent, PausedKind, Rollup
from django_intents.observability.rollup import FLUSH_INTERVAL, MINUTE, minute_of
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
    def charts(self) -> list[tuple[str, SafeString]]:
        """The row's four cells, in the table's column order: outcomes then depth,
        each over the hour and the day; the CSS class says how wide the cell is."""
        return [
            (css, draw(buckets, "%H:%M"))
            for css, draw in (("", outcome_chart), (" intents-chart-narrow", depth_chart))
            for buckets in (self.hour, self.day)
        ]


COLUMNS = ("completed", "failed", "snoozed", "cancelled", "due", "attempts")


def read_charts(now: datetime, using: str, paused: set[str]) -> list[KindCharts]:
    """Every kind with rollup rows in the last day (and every paused kind), by name.

    Two queries: the last hour's rows as they are (60 a kind at most), and the
    last day's summed per quarter hour by the database (96 a kind at most), so
    the page reads a few thousand rows however many minutes the table holds.
    """
    end = minute_of(now) + MINUTE
    quarter_start = end - MINUTE * ((end.minute % 15) or 15)  # the current quarter's start
    day_start, hour_start = quarter_start - (DAY - 1) * QUARTER, end - HOUR * MINUTE
    table = Rollup.objects.using(using).order_by()
    hour_rows = table.filter(minute__gte=hour_start, minute__lt=end).values_list(
        "kind", "minute", *COLUMNS, "duration_sum", "duration_max"
    )
    day_rows = (
        table.filter(minute__gte=day_start, minute__lt=end)
        .values_list(
            "kind",
            TruncHour("minute", tzinfo=UTC),
            Floor(ExtractMinute("minute", tzinfo=UTC) / 15),
        )
        .annotate(
            Sum("completed"),
            Sum("failed"),
            Sum("snoozed"),
            Sum("cancelled"),
            Max("due"),
            Sum("attempts"),
            Sum("duration_sum"),
            Max("duration_max"),
        )
    )
    charts: dict[str, KindCharts] = {}

    def chart(kind: str) -> KindCharts:
        if kind not in charts:
            charts[kind] = KindCharts(
                kind,
                [Bucket(hour_start + i * MINUTE) for i in range(HOUR)],
                [Bucket(day_start + i * QUARTER) for i in range(DAY)],
                kind in paused,
            )
        return charts[kind]

    for kind, hour, quarter, *counts, attempts, seconds, longest in day_rows:
        start = hour.astimezone(UTC) + int(quarter) * QUARTER
        kind_chart = chart(kind)
        kind_chart.rows += 1
        # Sums are decimals on MySQL: made ints here, where they are read.
        completed, failed, snoozed, cancelled, due = (
            None if count is None else int(count) for count in counts
        )
        kind_chart.day[int((start - day_start) / QUARTER)].add(
            completed or 0, failed or 0, snoozed or 0, cancelled or 0, due
        )
        kind_chart.day_timing.add(int(attempts), float(seconds), float(longest))
    for kind, minute, *counts, attempts, seconds, longest in hour_rows:
        kind_chart = chart(kind)
        kind_chart.hour[int((minute - hour_start) / MINUTE)].add(*counts)
        kind_chart.hour_timing.add(attempts, seconds, longest)
    for kind in paused:
        chart(kind)
    return [charts[kind] for kind in sorted(charts)]


# -- SVG -----------------------------------------------------------------------
#
# A chart is a few hundred elements, and a page has four per kind: they are
# written with f-strings, not one ``format_html`` each. What goes in is numbers
# the code formats and tooltip text, which ``escape`` escapes; no value from
# the application's data (a kind, a target) is ever part of a chart.


def _number(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _label(bucket: Bucket, time_format: str) -> str:
    return timezone.localtime(bucket.start).strftime(time_format)


def _svg(body: str, label: str, css: str) -> SafeString:
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
        mark_safe(body),  # noqa: S308 - built below from numbers and escaped text only
    )


def _paths(bars: dict[str, list[str]]) -> str:
    """One ``<path>`` per colour, of all its bars (``M x bottom v -h h w v h z`` each)."""
    return "".join(f'<path class="{css}" d="{"".join(d)}"/>' for css, d in bars.items() if d)


def _hits(hits: list[tuple[float, float, str]]) -> str:
    """A transparent full-height rectangle per bar, whose ``<title>`` is the bar's tooltip:
    a thin segment is then as easy to hover as a tall one."""
    rects = "".join(
        f'<rect x="{_number(x)}" width="{_number(width)}" height="{CHART_HEIGHT}">'
        f"<title>{escape(title)}</title></rect>"
        for x, width, title in hits
    )
    return f'<g class="intents-hit">{rects}</g>'


def _segment(x: float, bottom: float, width: float, height: float) -> str:
    return f"M{_number(x)} {_number(bottom)}v-{_number(height)}h{_number(width)}v{_number(height)}z"


def outcome_chart(buckets: Sequence[Bucket], time_format: str) -> SafeString:
    """Stacked bars of each bucket's outcomes, scaled to the busiest bucket; each bar's
    tooltip gives its numbers."""
    peak = max((bucket.finished for bucket in buckets), default=0) or 1
    step = CHART_WIDTH / len(buckets)
    width = max(step - 0.5, 0.5)
    text = _(
        "%(time)s: %(completed)d completed, %(failed)d failed, %(snoozed)d snoozed, "
        "%(cancelled)d cancelled"
    )
    bars: dict[str, list[str]] = {f"intents-{outcome}": [] for outcome in OUTCOMES}
    hits = []
    for index, bucket in enumerate(buckets):
        if not bucket.finished:
            continue
        bottom = float(CHART_HEIGHT)
        for outcome in OUTCOMES:
            height = getattr(bucket, outcome) / peak * CHART_HEIGHT
            if height:
                bars[f"intents-{outcome}"].append(_segment(index * step, bottom, width, height))
                bottom -= height
        title = text % {
            "time": _label(bucket, time_format),
            **{outcome: getattr(bucket, outcome) for outcome in OUTCOMES},
        }
        hits.append((index * step, width, title))
    total = sum(bucket.finished for bucket in buckets)
    label = _("%(n)d attempts finished") % {"n": total}
    return _svg(_paths(bars) + _hits(hits), label, "intents-chart-outcomes")


def depth_chart(buckets: Sequence[Bucket], time_format: str) -> SafeString:
    """The deepest due queue sampled in each bucket, as bars; unsampled buckets are blank."""
    peak = max((bucket.due or 0 for bucket in buckets), default=0) or 1
    step = CHART_WIDTH / len(buckets)
    width = max(step - 0.5, 0.5)
    text = _("%(time)s: %(due)d due")
    bars: list[str] = []
    hits = []
    for index, bucket in enumerate(buckets):
        if not bucket.due:
            continue
        height = bucket.due / peak * CHART_HEIGHT
        bars.append(_segment(index * step, CHART_HEIGHT, width, height))
        hits.append(
            (index * step, width, text % {"time": _label(bucket, time_format), "due": bucket.due})
        )
    deepest = max((bucket.due or 0 for bucket in buckets), default=0)
    label = _("at most %(n)d due") % {"n": deepest}
    return _svg(_paths({"intents-due": bars}) + _hits(hits), label, "intents-chart-depth")


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
    using = counted(request)  # its replica, if READ_DATABASE names one
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
        "intents_database": shown(modeladmin, request),
        "intents_replica": replica(request),
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
        # The Targets page's first rows, and how many targets are in each state.
        "targets": target_listing(modeladmin, now, using, LISTED),
        "targets_per_state": sorted(targets_per_state(using).items()),
        "flush_interval": int(FLUSH_INTERVAL),
        "outcomes": OUTCOMES,
    }
    return TemplateResponse(request, "admin/django_intents/intent/dashboard.html", context)


def _seconds(value: float) -> str:
    if value < 1:
        return _("%(n)d ms") % {"n": round(value * 1000)}
    return _("%(n).1f s") % {"n": value}
