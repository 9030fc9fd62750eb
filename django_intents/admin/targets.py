"""The Targets page, at ``intent/targets/``: every target that is not plainly healthy.

Per (kind, target) that is held, open, half-open or counting failures (SPEC
§14): its state, until when, its consecutive failures and last error, and
how many of its intents are pending and running, with *Close now* and *Hold
for…* (``actions.TARGET_CHANGES``) for users who may change intents. A row
links to the intents list filtered by its kind and target.

Two queries, whatever the tables hold: the first ``LISTED`` rows of the
small ``TargetState`` table (``store/targetrows``), and one grouped count of
the active intents of the listed kinds and targets, which the ``(kind,
state, event_id)`` index narrows to the listed kinds' pending and running
rows before their targets are compared. A change is a POST with the CSRF
token, answered by a redirect to the page (its message shown there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from django_intents.admin.actions import TARGET_CHANGES, change_target
from django_intents.admin.databases import chosen, shown
from django_intents.admin.humanize import relative
from django_intents.models import Intent
from django_intents.rules.states import ACTIVE, State
from django_intents.rules.targets import TargetRow
from django_intents.store.clock import server_now
from django_intents.store.targetrows import count_target_rows, read_target_rows

if TYPE_CHECKING:
    from django.contrib import admin

LISTED = 500  # rows on the page; past that, "and N more" (the gauge counts them all)
TARGET_PREVIEW = 32
ERROR_PREVIEW = 80
ERROR_TITLE = 1000
DEFAULT_HOLD = 300  # the seconds the "Hold for…" field offers


@dataclass(frozen=True)
class Listed:
    """One row of the page: the target, and how many of its intents wait and run."""

    row: TargetRow
    pending: int
    running: int
    until: str  # relative, "" when nothing holds it back
    intents_url: str

    @property
    def target(self) -> str:
        return Truncator(self.row.target).chars(TARGET_PREVIEW)

    @property
    def error(self) -> str:
        lines = self.row.last_error.strip().splitlines() or [""]
        return Truncator(lines[0]).chars(ERROR_PREVIEW)

    @property
    def error_title(self) -> str:
        return Truncator(self.row.last_error).chars(ERROR_TITLE)


def active_counts(rows: Sequence[TargetRow], using: str) -> dict[tuple[str, str, str], int]:
    """``(kind, target, state)``: how many pending and running intents each listed target
    has, in one grouped query of the listed kinds' active intents."""
    if not rows:
        return {}
    pairs = {(row.kind, row.target) for row in rows}
    grouped = (
        Intent.objects.using(using)
        .order_by()
        .filter(
            kind__in=sorted({kind for kind, _ in pairs}),
            state__in=ACTIVE,
            target__in=sorted({target for _, target in pairs}),
        )
        .values_list("kind", "target", "state")
        .annotate(n=Count("pk"))
    )
    return {(k, t, s): n for k, t, s, n in grouped if (k, t) in pairs}


def listing(
    modeladmin: admin.ModelAdmin[Intent], now: datetime, using: str, limit: int
) -> list[Listed]:
    """The first ``limit`` targets that are not plainly healthy, with their intents' counts."""
    changelist_url = _url(modeladmin, "changelist")
    rows = read_target_rows(using, now=now, limit=limit)
    counts = active_counts(rows, using)
    return [
        Listed(
            row,
            counts.get((row.kind, row.target, State.PENDING), 0),
            counts.get((row.kind, row.target, State.RUNNING), 0),
            "" if row.until is None else relative(row.until, now),
            f"{changelist_url}?{urlencode({'kind': row.kind, 'target': row.target})}",
        )
        for row in rows
    ]


def per_state(using: str) -> dict[str, int]:
    """How many targets are in each state, every kind together (the gauge's query)."""
    totals: dict[str, int] = {}
    for (_kind, state), count in count_target_rows(using).items():
        totals[state] = totals.get(state, 0) + count
    return totals


def targets_view(modeladmin: admin.ModelAdmin[Intent], request: HttpRequest) -> HttpResponse:
    """The page, for users who may view intents; its buttons, for those who may change them."""
    if not modeladmin.has_view_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        if not modeladmin.has_change_permission(request):
            raise PermissionDenied
        changes = {change.name: change for change in TARGET_CHANGES}
        change = changes.get(request.POST.get("action", ""))
        if change is None:
            raise PermissionDenied  # a forged action, as the list refuses one
        post = request.POST
        change_target(
            modeladmin,
            request,
            change,
            post.get("kind", ""),
            post.get("target", ""),
            post.get("seconds"),
        )
        return HttpResponseRedirect(_url(modeladmin, "targets"))
    using = chosen(request)
    now = server_now(using)
    rows = listing(modeladmin, now, using, LISTED)
    states = per_state(using)
    total = sum(states.values())
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.opts,
        "title": _("Targets"),
        "intents_database": shown(modeladmin, request),
        "now": now,
        "rows": rows,
        "per_state": sorted(states.items()),
        "more": max(total - len(rows), 0),
        "can_change": modeladmin.has_change_permission(request),
        "changes": {change.name: change for change in TARGET_CHANGES},
        "default_hold": DEFAULT_HOLD,
    }
    return TemplateResponse(request, "admin/django_intents/intent/targets.html", context)


def _url(modeladmin: admin.ModelAdmin[Intent], name: str) -> str:
    opts, site = modeladmin.opts, modeladmin.admin_site.name
    return reverse(f"{site}:{opts.app_label}_{opts.model_name}_{name}", current_app=site)
