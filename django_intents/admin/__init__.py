"""The admin for intents: look, retry now, cancel, pause a kind; never edit by hand.

Intents are created by code and move only through the manager's guarded
transitions, so every field is read-only and the administrative transitions
(``retry_now`` and ``cancel``, which fence a running claimant; declared in
``actions``) are offered as actions on the list and as buttons on one
intent's page. Saving the change form would write a stale copy of the row over
whatever a worker did in the meantime, so there is no form to save. Above the
list, ``summary`` counts the queue, with a pause or resume button per kind,
and lists the schedules with their last and next slot.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.functional import SimpleLazyObject
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator, capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from django_intents.admin.actions import (
    KIND_CHANGES,
    TRANSITIONS,
    KindChange,
    Transition,
    action,
    apply,
    change_kind,
    confirmation,
    delete_selected,
)
from django_intents.admin.changelist import (
    CountingPaginator,
    IntentChangeList,
    KindFilter,
    LastErrorFilter,
    TargetFilter,
    search,
)
from django_intents.admin.dashboard import dashboard_view
from django_intents.admin.databases import chosen, counted, database_view, replica, shown
from django_intents.admin.humanize import pre_json, relative, timestamp
from django_intents.admin.summary import SCHEDULE_COLUMNS, queue_summary
from django_intents.admin.targets import targets_view
from django_intents.maintenance.schedules import listing
from django_intents.models import Intent
from django_intents.rules.states import TERMINAL, State
from django_intents.store.clock import server_now

try:
    from django_intents.admin import tasks as task_display
except ImportError:  # no django.tasks (Django 5.2 without django-tasks): no Task section
    task_display = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

SHORT_ID = 12
ERROR_PREVIEW = 80
ERROR_TITLE = 1000
TARGET_PREVIEW = 48
PAYLOAD_DISPLAY_LIMIT = 100_000


@admin.register(Intent)
class IntentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    # What an operator scans first, left to right; at 1280 px the list fits without
    # scrolling sideways (admin.css keeps each cell to one line, long values cut short).
    # When an intent last changed is on its own page.
    list_display = (
        "short_id",
        "state_badge",
        "kind",
        "target_summary",
        "attempts",
        "priority",
        "next_run",
        "error_summary",
    )
    list_filter = ("state", KindFilter, LastErrorFilter, TargetFilter)
    # Django's search box; get_search_results (changelist.search) does the searching.
    search_fields = ("^id", "event_id", "target")
    search_help_text = gettext_lazy(
        "Search by id (or its beginning) or event id; failing those, by text inside "
        "event ids and targets."
    )
    # Newest first (ties by id, which Django adds), from an index; "Next run"
    # sorts in claim order.
    ordering = ("-created_at",)
    # A COUNT(*) of the whole table on every filtered page is not worth it; the
    # page's own count is bounded (changelist.CountingPaginator).
    show_full_result_count = False
    paginator = CountingPaginator
    # One per administrative transition (actions.TRANSITIONS), then deletion.
    actions = (*(action(transition) for transition in TRANSITIONS), delete_selected)
    fieldsets = (
        (None, {"fields": ("id", "kind", "state_badge", "event_id", "target")}),
        (
            gettext_lazy("Schedule"),
            {
                "fields": (
                    "attempts",
                    "priority",
                    "next_at",
                    "next_run",
                    "created_at",
                    "updated_at",
                )
            },
        ),
        (gettext_lazy("Claim"), {"fields": ("claim_token", "claim_until")}),
        (gettext_lazy("Last error"), {"fields": ("last_error_text", "last_traceback_text")}),
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
    def next_run(self, intent: Intent) -> SafeString:
        now = server_now(intent._state.db)
        if intent.state == State.PENDING:
            return timestamp(intent.next_at, relative(intent.next_at, now))
        if intent.state == State.RUNNING and intent.claim_until is not None:
            if intent.claim_until > now:
                text = _("lease ends %(when)s") % {"when": relative(intent.claim_until, now)}
            else:
                text = _("lease expired %(when)s") % {"when": relative(intent.claim_until, now)}
            return timestamp(intent.claim_until, text)
        # Finished: no next run. The dash, on the list and on the intent's page alike.
        return self.get_empty_value_display()

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

    @admin.display(description=gettext_lazy("traceback"))
    def last_traceback_text(self, intent: Intent) -> SafeString | None:
        """The tail of the last failure's traceback, as the pool kept it (escaped)."""
        if not intent.last_traceback:
            return None
        return format_html('<pre class="intents-pre">{}</pre>', intent.last_traceback)

    @admin.display(description=gettext_lazy("payload"))
    def payload_pretty(self, intent: Intent) -> SafeString | None:
        if intent.payload is None:
            return None
        return pre_json(intent.payload, PAYLOAD_DISPLAY_LIMIT)

    @admin.display(description=gettext_lazy("task"))
    def task_details(self, intent: Intent) -> SafeString | None:
        """What a ``django.tasks`` intent runs and what became of it, as ``get_result`` reads it."""
        if not _is_task(intent):
            return None
        return task_display.task_details(intent)

    def get_fieldsets(self, request: HttpRequest, obj: Intent | None = None) -> _FieldsetSpec:
        """The declared fieldsets, with a "Task" section after the first for task intents."""
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and obj.state in TERMINAL:
            # A finished intent has no next run: its stale next_at would read as one.
            fieldsets = [
                (name, {**options, "fields": [f for f in options["fields"] if f != "next_at"]})
                for name, options in fieldsets
            ]
        if obj is not None and _is_task(obj):
            fieldsets.insert(1, (_("Task"), {"fields": ("task_details",)}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Intent | None = None) -> list[str]:
        """Everything: every model field (from ``_meta``, so new ones too) and the displays."""
        displays = ["state_badge", "next_run", "last_error_text", "last_traceback_text"]
        displays += ["payload_pretty", "task_details"]
        return [field.name for field in self.opts.concrete_fields] + displays

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Intent | None = None,
    ) -> HttpResponse:
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
        if intent is None or not self.has_change_permission(request, intent):
            return []
        return [
            {"name": t.name, "label": str(t.button), "url": self._url(t.name, intent.pk)}
            for t in TRANSITIONS
            if intent.state in t.sources
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
        context = {**(extra_context or {}), "intents_database": shown(self, request)}
        return super().changeform_view(request, object_id, form_url, context)

    # -- permissions ----------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Intent | None = None) -> bool:
        """Only finished intents: deleting a live one would lose work a worker may be doing."""
        if obj is not None and obj.state not in TERMINAL:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Intent]) -> None:
        super().delete_queryset(request, queryset.filter(state__in=TERMINAL))

    # -- the list page ------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Intent]:
        """The intents of the database this user looks at (``chosen``)."""
        return super().get_queryset(request).using(chosen(request))

    def get_paginator(
        self, request: HttpRequest, queryset: QuerySet[Intent], per_page: int, *args: Any, **kw: Any
    ) -> CountingPaginator:
        """The list's count from the replica, when ``READ_DATABASE`` names one; its rows
        from the primary, where the buttons act."""
        paginator = CountingPaginator(queryset, per_page, *args, **kw)
        paginator.counted_on = counted(request)
        return paginator

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return IntentChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Intent], search_term: str
    ) -> tuple[QuerySet[Intent], bool]:
        return search(queryset, search_term), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        chosen = request.POST.get("action") if request.method == "POST" else None
        if chosen and chosen not in self.get_actions(request):
            # Django would answer "no action selected"; a forged action is refused.
            raise PermissionDenied
        using = counted(request)
        context = {
            # Django's "Select intent to change" promises edits this admin does not offer.
            "title": _("Intents"),
            **(extra_context or {}),
            "intents_database": shown(self, request),
            "intents_replica": SimpleLazyObject(partial(replica, request)),
            # Lazy: only a page that renders the summary pays for its query.
            "intents_summary": SimpleLazyObject(partial(queue_summary, using=using)),
            # No query without schedules.
            "intents_schedules": SimpleLazyObject(partial(listing, using=using)),
            "intents_schedule_columns": SCHEDULE_COLUMNS,
        }
        if self.has_change_permission(request):  # the summary's pause and resume buttons
            context["intents_kind_urls"] = {c.name: self._url(c.name) for c in KIND_CHANGES}
        return super().changelist_view(request, context)

    # -- buttons: on the change page, and the summary's pause and resume ----------------

    def get_urls(self) -> list[URLPattern]:
        buttons = [
            self._post(f"<path:object_id>/{t.path}", partial(self.transition_view, t), t.name)
            for t in TRANSITIONS
        ]
        kinds = [
            self._post(f"kinds/{c.name}/", partial(self.kind_view, c), c.name) for c in KIND_CHANGES
        ]
        pages = [
            self._post("database/", partial(database_view, self), "database"),
            self._page("dashboard/", partial(dashboard_view, self), "dashboard"),
            self._page("targets/", partial(targets_view, self), "targets"),
        ]
        return buttons + kinds + pages + super().get_urls()

    def _page(
        self, route: str, view: Callable[[HttpRequest], HttpResponse], name: str
    ) -> URLPattern:
        """This admin's page ``name`` at ``route``, for its staff users (the dashboard, the
        targets): named ``<app>_<model>_<name>`` like the model's own pages."""
        return path(route, self.admin_site.admin_view(view), name=self._url_name(name))

    def _post(self, route: str, view: Callable[..., HttpResponse], name: str) -> URLPattern:
        """This admin's URL ``name`` at ``route``: a view for POSTs from the admin's users."""
        return path(
            route, self.admin_site.admin_view(require_POST(view)), name=self._url_name(name)
        )

    def transition_view(
        self, transition: Transition, request: HttpRequest, object_id: str
    ) -> HttpResponse:
        """A button's POST: the transition on one intent, then back to its page; one that
        asks first (``Transition.confirm``) answers with its confirmation page, whose
        form posts here again with ``post=yes``."""
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
        if transition.confirm and request.POST.get("post") != "yes":
            return confirmation(
                self, request, transition, self.get_queryset(request).filter(pk=intent.pk), []
            )
        apply(self, request, {intent.pk: intent.kind}, transition)
        return HttpResponseRedirect(self._url("change", intent.pk))

    def kind_view(self, change: KindChange, request: HttpRequest) -> HttpResponse:
        """A pause or resume button's POST: the change on its ``kind``, then back to the list."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        change_kind(self, request, change, request.POST.get("kind", ""))
        return HttpResponseRedirect(self._url("changelist"))

    def _url_name(self, name: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{name}"

    def _url(self, name: str, *pks: str) -> str:
        return reverse(
            f"{self.admin_site.name}:{self._url_name(name)}",
            args=[quote(pk) for pk in pks],
            current_app=self.admin_site.name,
        )


def _is_task(intent: Intent) -> bool:
    """Whether ``intent`` is a task and a task framework is installed to read its record."""
    return task_display is not None and intent.kind == task_display.TASK_KIND
