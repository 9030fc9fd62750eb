"""The admin for intents: look, retry now, cancel; never edit by hand.

Intents are created by code and move only through the manager's guarded
transitions, so every field is read-only and the two administrative
transitions (``retry_now`` and ``cancel``, which fence a running claimant) are
offered as actions on the list and as buttons on one intent's page. Saving the
change form would write a stale copy of the row over whatever a worker did in
the meantime, so there is no form to save.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.util import find_spec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Case, Count, F, Min, Q, QuerySet, When
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.formats import localize
from django.utils.functional import SimpleLazyObject
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .models import Intent

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

PENDING, RUNNING = Intent.State.PENDING, Intent.State.RUNNING
SHORT_ID = 12
ERROR_PREVIEW = 80
ERROR_TITLE = 1000
TARGET_PREVIEW = 60
PAYLOAD_DISPLAY_LIMIT = 100_000
SKIPPED_LOOKUP_BATCH = 500
TASK_VALUE_LIMIT = 20_000  # per argument list, return value or traceback on the task block
TASK_VALUE_INLINE = 80  # JSON shorter than this stays on one line


# -- time, as people read it ---------------------------------------------------


def short_duration(seconds: float) -> str:
    """``45 s``, ``3 min``, ``5 h``, ``2 d``: coarse on purpose, a queue is read at a glance."""
    seconds = abs(seconds)
    if seconds < 90:
        return _("%(n)d s") % {"n": round(seconds)}
    if seconds < 90 * 60:
        return _("%(n)d min") % {"n": round(seconds / 60)}
    if seconds < 36 * 3600:
        return _("%(n)d h") % {"n": round(seconds / 3600)}
    return _("%(n)d d") % {"n": round(seconds / 86400)}


def relative(moment: datetime, now: datetime) -> str:
    """``in 3 min`` or ``2 min ago``."""
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 1:
        return _("now")
    if seconds > 0:
        return _("in %(duration)s") % {"duration": short_duration(seconds)}
    return _("%(duration)s ago") % {"duration": short_duration(seconds)}


def _timestamp(moment: datetime, text: str) -> SafeString:
    return format_html('<span title="{}">{}</span>', localize(timezone.localtime(moment)), text)


# -- the summary above the list ------------------------------------------------


@dataclass(frozen=True)
class StateCount:
    value: str
    label: str
    count: int


@dataclass(frozen=True)
class KindSummary:
    kind: str
    active: int
    due: int
    oldest_due_age: timedelta | None

    @property
    def waiting(self) -> str:
        age = self.oldest_due_age
        return "" if age is None else short_duration(age.total_seconds())


@dataclass(frozen=True)
class QueueSummary:
    states: list[StateCount]
    kinds: list[KindSummary]
    due: int
    oldest_due_age: timedelta | None

    @property
    def waiting(self) -> str:
        age = self.oldest_due_age
        return "" if age is None else short_duration(age.total_seconds())


def queue_summary(now: datetime | None = None) -> QueueSummary:
    """Count intents per state and, per kind, what is due and for how long.

    One ``GROUP BY kind, state`` query with filtered aggregates, so the cost of
    the summary does not grow with the number of kinds or pages. "Due" is what a
    claim at ``now`` could take (as ``IntentQuerySet.due``): a pending intent
    past ``next_at`` (due since then) or a running one whose lease has expired
    (due since ``claim_until``).
    """
    now = timezone.now() if now is None else now
    due = Q(state=PENDING, next_at__lte=now) | Q(state=RUNNING, claim_until__lte=now)
    due_since = Case(When(state=PENDING, then=F("next_at")), default=F("claim_until"))
    rows = (
        Intent.objects.order_by()
        .values("kind", "state")
        .annotate(n=Count("pk"), due=Count("pk", filter=due), since=Min(due_since, filter=due))
    )
    states: Counter[str] = Counter()
    active: Counter[str] = Counter()
    due_count: Counter[str] = Counter()
    oldest: dict[str, datetime] = {}
    for row in rows:
        kind = row["kind"]
        states[row["state"]] += row["n"]
        if row["state"] in Intent.ACTIVE_STATES:
            active[kind] += row["n"]
        due_count[kind] += row["due"]
        if row["since"] is not None and (kind not in oldest or row["since"] < oldest[kind]):
            oldest[kind] = row["since"]
    kinds = [
        KindSummary(
            kind, active[kind], due_count[kind], now - oldest[kind] if kind in oldest else None
        )
        for kind in sorted(active)
    ]
    ages = [kind.oldest_due_age for kind in kinds if kind.oldest_due_age is not None]
    return QueueSummary(
        states=[
            StateCount(value, str(label), states[value]) for value, label in Intent.State.choices
        ],
        kinds=kinds,
        due=sum(due_count.values()),
        oldest_due_age=max(ages) if ages else None,
    )


# -- the list ---------------------------------------------------------------------


class LastErrorFilter(admin.SimpleListFilter):
    """Failing intents: pending ones waiting to retry after an error, or cancelled with one."""

    title = gettext_lazy("last error")
    parameter_name = "error"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("yes", _("Has an error")), ("no", _("No error"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Intent]) -> QuerySet[Intent]:
        if self.value() == "yes":
            return queryset.exclude(last_error="")
        if self.value() == "no":
            return queryset.filter(last_error="")
        return queryset


class IntentChangeList(ChangeList):
    """Sorting by "next run" is the claim order: ties broken as the claim breaks them."""

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Intent]) -> list[Any]:
        ordering = super().get_ordering(request, queryset)
        if ordering and ordering[0] in ("next_at", "-next_at"):
            sign = "-" if ordering[0].startswith("-") else ""
            ties = ("created_at", "id", "pk")
            rest = [
                part
                for part in ordering[1:]
                if not (isinstance(part, str) and part.lstrip("-") in ties)
            ]
            ordering = [ordering[0], f"{sign}created_at", f"{sign}id", *rest]
        return ordering

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: Any = None
    ) -> QuerySet[Intent]:
        # Payloads can be large and the list never shows them.
        return super().get_queryset(request, exclude_parameters).defer("payload")


@dataclass(frozen=True)
class _Transition:
    """An administrative manager method and how the admin talks about it."""

    method: str
    changed: Callable[[int], str]
    log: str


TRANSITIONS = {
    "retry_now": _Transition(
        "retry_now",
        lambda count: (
            ngettext(
                "Scheduled %(count)d intent to run now.",
                "Scheduled %(count)d intents to run now.",
                count,
            )
            % {"count": count}
        ),
        "Retried now.",
    ),
    "cancel": _Transition(
        "cancel",
        lambda count: (
            ngettext("Cancelled %(count)d intent.", "Cancelled %(count)d intents.", count)
            % {"count": count}
        ),
        "Cancelled.",
    ),
}


@admin.register(Intent)
class IntentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "short_id",
        "kind",
        "target_summary",
        "state_badge",
        "attempts",
        "next_run",
        "updated_at",
        "error_summary",
    )
    list_filter = ("state", "kind", LastErrorFilter)
    search_fields = ("^id", "event_id", "target")
    search_help_text = gettext_lazy("Search by id (or its beginning), event id or target.")
    # Newest first (ties by id, which Django adds); "Next run" sorts in claim order.
    ordering = ("-created_at",)
    # A COUNT(*) of the whole table on every filtered page is not worth it.
    show_full_result_count = False
    actions = ("retry_now", "cancel", "delete_selected")
    fieldsets = (
        (None, {"fields": ("id", "kind", "state_badge", "event_id", "target")}),
        (
            gettext_lazy("Schedule"),
            {"fields": ("attempts", "next_at", "next_run", "created_at", "updated_at")},
        ),
        (gettext_lazy("Claim"), {"fields": ("claim_token", "claim_until")}),
        (gettext_lazy("Last error"), {"fields": ("last_error_text",)}),
        (gettext_lazy("Payload"), {"fields": ("payload_pretty",)}),
    )

    class Media:
        css = {"all": ("django_intents/admin.css",)}

    # -- columns ----------------------------------------------------------------

    # Not sortable: ids are hashes, so their order means nothing.
    @admin.display(description=gettext_lazy("id"))
    def short_id(self, intent: Intent) -> SafeString:
        return format_html(
            '<span class="intents-id" title="{}">{}</span>', intent.id, intent.id[:SHORT_ID]
        )

    # Not sortable: no index orders by target. A task intent's target is its function.
    @admin.display(description=gettext_lazy("target"))
    def target_summary(self, intent: Intent) -> SafeString:
        return format_html(
            '<span class="intents-target" title="{}">{}</span>',
            intent.target,
            Truncator(intent.target).chars(TARGET_PREVIEW),
        )

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_badge(self, intent: Intent) -> SafeString:
        return format_html(
            '<span class="intents-state intents-state-{}">{}</span>',
            intent.state,
            intent.get_state_display(),
        )

    @admin.display(description=gettext_lazy("next run"), ordering="next_at")
    def next_run(self, intent: Intent) -> SafeString | None:
        now = timezone.now()
        if intent.state == PENDING:
            return _timestamp(intent.next_at, relative(intent.next_at, now))
        if intent.state == RUNNING and intent.claim_until is not None:
            if intent.claim_until > now:
                text = _("lease ends %(when)s") % {"when": relative(intent.claim_until, now)}
            else:
                text = _("lease expired %(when)s") % {"when": relative(intent.claim_until, now)}
            return _timestamp(intent.claim_until, text)
        return None

    @admin.display(description=gettext_lazy("last error"))
    def error_summary(self, intent: Intent) -> SafeString | None:
        if not intent.last_error:
            return None
        lines = intent.last_error.strip().splitlines() or [intent.last_error]
        return format_html(
            '<span class="intents-error" title="{}">{}</span>',
            Truncator(intent.last_error).chars(ERROR_TITLE),
            Truncator(lines[0]).chars(ERROR_PREVIEW),
        )

    # -- the change page ----------------------------------------------------------

    @admin.display(description=gettext_lazy("last error"))
    def last_error_text(self, intent: Intent) -> SafeString | None:
        if not intent.last_error:
            return None
        return format_html('<pre class="intents-pre">{}</pre>', intent.last_error)

    @admin.display(description=gettext_lazy("payload"))
    def payload_pretty(self, intent: Intent) -> SafeString | None:
        if intent.payload is None:
            return None
        # Sorted: PostgreSQL and MySQL store JSON objects in their own key order anyway.
        text = json.dumps(intent.payload, indent=2, ensure_ascii=False, sort_keys=True)
        return format_html(
            '<pre class="intents-pre">{}</pre>', _truncated(text, PAYLOAD_DISPLAY_LIMIT)
        )

    @admin.display(description=gettext_lazy("task"))
    def task_details(self, intent: Intent) -> SafeString | None:
        """What a ``django.tasks`` intent runs and what became of it, as ``get_result`` reads it."""
        record_module = _task_record_module()
        if record_module is None or intent.kind != record_module.TASK_KIND:
            return None
        if intent.payload is None:
            return format_html("<p>{}</p>", _("No task record: retention compacted the payload."))
        try:
            record = record_module.TaskRecord.from_payload(intent.payload)
        except record_module.MalformedRecord as exc:
            return format_html('<p class="intents-error">{}</p>', str(exc))
        status = record_module.STATUS[intent.state]
        rows: list[tuple[str, SafeString]] = [
            (_("Function"), format_html("<code>{}</code>", record.path)),
            (_("Arguments"), _pre_json(record.args)),
            (_("Keyword arguments"), _pre_json(record.kwargs)),
            (_("Status"), format_html("{}", status.label)),
            (_("Queue"), format_html("{} (backend {})", record.queue_name, record.backend)),
        ]
        if record.idempotency_key is not None:
            key = format_html("<code>{}</code>", record.idempotency_key)
            rows.append((_("Idempotency key"), key))
        if record.worker_ids:
            rows.append((_("Workers"), format_html("{}", ", ".join(record.worker_ids))))
        if record.has_return_value:
            rows.append((_("Return value"), _pre_json(record.return_value)))
        if record.errors:
            last = record.errors[-1]
            rows.append((_("Errors recorded"), format_html("{}", len(record.errors))))
            rows.append(
                (
                    _("Last error"),
                    format_html(
                        '<code>{}</code><pre class="intents-pre">{}</pre>',
                        last.exception_class_path,
                        _truncated(last.traceback),
                    ),
                )
            )
        return format_html(
            '<table class="intents-task"><tbody>{}</tbody></table>',
            format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>', rows),
        )

    def get_fieldsets(self, request: HttpRequest, obj: Intent | None = None) -> _FieldsetSpec:
        """The declared fieldsets, with a "Task" section after the first for task intents."""
        fieldsets = list(super().get_fieldsets(request, obj))
        record_module = _task_record_module()
        if obj is not None and record_module is not None and obj.kind == record_module.TASK_KIND:
            fieldsets.insert(1, (_("Task"), {"fields": ("task_details",)}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Intent | None = None) -> list[str]:
        """Everything: every model field (from ``_meta``, so new ones too) and the displays."""
        displays = ["state_badge", "next_run", "last_error_text", "payload_pretty", "task_details"]
        return [field.name for field in self.opts.concrete_fields] + displays

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Intent | None = None,
    ) -> TemplateResponse:
        context.update(
            # Not "Change intent": nothing on this page edits it.
            title=capfirst(self.opts.verbose_name),
            show_save=False,
            show_save_and_continue=False,
            show_save_and_add_another=False,
            intent_buttons=self._buttons(request, obj),
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _buttons(self, request: HttpRequest, intent: Intent | None) -> list[dict[str, str]]:
        if intent is None or intent.state not in Intent.ACTIVE_STATES:
            return []
        if not self.has_change_permission(request, intent):
            return []
        labels = {"retry_now": _("Retry now"), "cancel": _("Cancel intent")}
        return [
            {"name": name, "label": label, "url": self._url(name, intent.pk)}
            for name, label in labels.items()
        ]

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST":
            # Intents change only through the manager's transitions.
            raise PermissionDenied
        return super().changeform_view(request, object_id, form_url, extra_context)

    # -- permissions ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Intent | None = None) -> bool:
        """Only finished intents: deleting a live one would lose work a worker may be doing."""
        if obj is not None and obj.state not in Intent.TERMINAL_STATES:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Intent]) -> None:
        super().delete_queryset(request, queryset.filter(state__in=Intent.TERMINAL_STATES))

    # -- actions ----------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return IntentChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            # Django would answer "no action selected"; a forged action is refused.
            raise PermissionDenied
        context = {
            # Django's "Select intent to change" promises edits this admin does not offer.
            "title": _("Intents"),
            **(extra_context or {}),
            # Lazy: only a page that renders the summary pays for its query.
            "intents_summary": SimpleLazyObject(queue_summary),
        }
        return super().changelist_view(request, context)

    @admin.action(description=gettext_lazy("Retry now"), permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Intent]) -> None:
        self._apply(request, _for_transition(queryset), TRANSITIONS["retry_now"])

    @admin.action(description=gettext_lazy("Cancel"), permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Intent]) -> None:
        self._apply(request, _for_transition(queryset), TRANSITIONS["cancel"])

    @admin.action(
        description=gettext_lazy("Delete selected completed or cancelled intents"),
        permissions=["delete"],
    )
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[Intent]
    ) -> TemplateResponse | None:
        """Django's delete action, on the finished part of the selection only."""
        active = queryset.filter(state__in=Intent.ACTIVE_STATES).count()
        if active:
            self.message_user(
                request,
                ngettext(
                    "Skipped %(count)d intent that is still pending or running: "
                    "only completed and cancelled intents can be deleted.",
                    "Skipped %(count)d intents that are still pending or running: "
                    "only completed and cancelled intents can be deleted.",
                    active,
                )
                % {"count": active},
                messages.WARNING,
            )
        finished = queryset.filter(state__in=Intent.TERMINAL_STATES)
        if not finished.exists():
            return None
        return django_delete_selected(self, request, finished)  # type: ignore[no-any-return]

    def _apply(
        self, request: HttpRequest, intents: Sequence[Intent], transition: _Transition
    ) -> None:
        """Run one manager transition per intent and report what changed and what did not."""
        method = getattr(Intent.objects, transition.method)
        changed = [intent for intent in intents if method(intent.pk)]
        changed_ids = {intent.pk for intent in changed}
        skipped = [intent.pk for intent in intents if intent.pk not in changed_ids]
        if changed:
            LogEntry.objects.log_actions(
                user_id=request.user.pk,
                queryset=changed,
                action_flag=CHANGE,
                change_message=transition.log,
            )
            self.message_user(request, transition.changed(len(changed)), messages.SUCCESS)
        if skipped:
            self.message_user(request, _skipped_message(skipped), messages.WARNING)

    # -- buttons on the change page ------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                f"<path:object_id>/{name.replace('_', '-')}/",
                self.admin_site.admin_view(self._button_view(name)),
                name=self._url_name(name),
            )
            for name in TRANSITIONS
        ] + super().get_urls()

    def _url_name(self, name: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{name}"

    def _url(self, name: str, *pks: str) -> str:
        return reverse(
            f"{self.admin_site.name}:{self._url_name(name)}",
            args=[quote(pk) for pk in pks],
            current_app=self.admin_site.name,
        )

    def _button_view(self, name: str) -> Any:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            if request.method != "POST":
                return HttpResponseNotAllowed(["POST"])
            intent = self.get_object(request, unquote(object_id))
            if not self.has_change_permission(request, intent):
                raise PermissionDenied
            if intent is None:
                self.message_user(
                    request,
                    _("There is no intent with id “%(id)s”; perhaps it was deleted.")
                    % {"id": unquote(object_id)},
                    messages.WARNING,
                )
                return HttpResponseRedirect(self._url("changelist"))
            self._apply(request, [intent], TRANSITIONS[name])
            return HttpResponseRedirect(self._url("change", intent.pk))

        view.__name__ = f"{name}_view"
        return view


@functools.cache
def _task_record_module() -> ModuleType | None:
    """``django_intents.tasks.record``, or None when no task framework is installed.

    Looked up, not imported, first: on Django 5.2 without the django-tasks
    backport, importing ``django_intents.tasks`` raises, and the admin must
    work the same for every other kind.
    """
    if find_spec("django.tasks") is None and find_spec("django_tasks") is None:
        return None
    from .tasks import record

    return record


def _truncated(text: str, limit: int = TASK_VALUE_LIMIT) -> str:
    """``text`` cut at ``limit`` characters, saying so."""
    if len(text) <= limit:
        return text
    return text[:limit] + "\n" + _("… (%(count)d characters, truncated)") % {"count": len(text)}


def _pre_json(value: Any) -> SafeString:
    """``value`` as JSON in a ``<pre>``: on one line when short, indented when not."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if len(text) > TASK_VALUE_INLINE:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre class="intents-pre">{}</pre>', _truncated(text))


def _for_transition(queryset: QuerySet[Intent]) -> list[Intent]:
    # Only what the transition and the log need; the selection may be large.
    return list(queryset.order_by().only("id", "kind", "state"))


def _skipped_message(ids: Sequence[str]) -> str:
    """Say why intents were not changed, from their state now (one query per 500)."""
    states: Counter[str] = Counter()
    for start in range(0, len(ids), SKIPPED_LOOKUP_BATCH):
        chunk = ids[start : start + SKIPPED_LOOKUP_BATCH]
        states.update(Intent.objects.filter(pk__in=chunk).values_list("state", flat=True))
    completed, cancelled = states[Intent.State.COMPLETED], states[Intent.State.CANCELLED]
    # The transitions refuse only finished intents, so anything else moved meanwhile.
    moved = states.total() - completed - cancelled
    gone = len(ids) - states.total()
    reasons = []
    if completed:
        reasons.append(
            ngettext("%(count)d already completed", "%(count)d already completed", completed)
            % {"count": completed}
        )
    if cancelled:
        reasons.append(
            ngettext("%(count)d already cancelled", "%(count)d already cancelled", cancelled)
            % {"count": cancelled}
        )
    if moved:
        reasons.append(
            ngettext("%(count)d changed meanwhile", "%(count)d changed meanwhile", moved)
            % {"count": moved}
        )
    if gone:
        reasons.append(
            ngettext("%(count)d no longer exists", "%(count)d no longer exist", gone)
            % {"count": gone}
        )
    return ngettext(
        "Skipped %(count)d intent: %(reasons)s.",
        "Skipped %(count)d intents: %(reasons)s.",
        len(ids),
    ) % {"count": len(ids), "reasons": ", ".join(reasons)}
