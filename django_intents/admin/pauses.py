"""Pause and resume a kind from the summary above the intents list (SPEC §11).

Each is a POST (the admin's CSRF protection) of one ``kind`` to
``kinds/pause/`` or ``kinds/resume/``, allowed to users who may change
intents, reported with a message and recorded as a ``LogEntry`` on the
paused kind, as the administrative transitions are on their intents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy

from django_intents.models import Intent, PausedKind

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise


@dataclass(frozen=True)
class KindChange:
    name: str  # the manager method; also the URL (``kinds/<name>/``) and its name
    button: StrPromise
    done: StrPromise  # "%(kind)s": the kind changed
    unchanged: StrPromise  # "%(kind)s": nothing to do
    log: str  # the LogEntry change message; untranslated, like Django's own


KIND_CHANGES = (
    KindChange(
        "pause",
        gettext_lazy("Pause"),
        gettext_lazy("Paused kind “%(kind)s”: pools stop claiming it at their next claim."),
        gettext_lazy("Kind “%(kind)s” was already paused."),
        "Paused.",
    ),
    KindChange(
        "resume",
        gettext_lazy("Resume"),
        gettext_lazy("Resumed kind “%(kind)s”: pools claim it again at their next claim."),
        gettext_lazy("Kind “%(kind)s” was not paused."),
        "Resumed.",
    ),
)


def kind_view(
    modeladmin: admin.ModelAdmin[Intent], change: KindChange, request: HttpRequest
) -> HttpResponse:
    """The POST of a pause or resume button, then back to the list."""
    if not modeladmin.has_change_permission(request):
        raise PermissionDenied
    opts = modeladmin.opts
    back = HttpResponseRedirect(
        reverse(
            f"{modeladmin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist",
            current_app=modeladmin.admin_site.name,
        )
    )
    kind = request.POST.get("kind", "")
    try:
        changed = getattr(Intent.objects, change.name)(kind)
    except ValueError as exc:
        modeladmin.message_user(request, str(exc), messages.ERROR)
        return back
    if not changed:
        modeladmin.message_user(request, change.unchanged % {"kind": kind}, messages.WARNING)
        return back
    LogEntry.objects.log_actions(
        user_id=cast(int, request.user.pk),  # admin views require a logged-in user
        queryset=[PausedKind(kind=kind, paused_at=timezone.now())],
        action_flag=CHANGE,
        change_message=change.log,
    )
    modeladmin.message_user(request, change.done % {"kind": kind}, messages.SUCCESS)
    return back
