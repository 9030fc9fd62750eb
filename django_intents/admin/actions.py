"""What the admin changes, each change declared once: transitions, pauses, deletion.

An administrative transition is a manager method that takes an intent id and
returns whether it moved the intent (``Intent.objects.retry_now(id)``). One
entry in ``TRANSITIONS`` gives the list action (with Django's permission check
on "change"), the change-page button and its label, the button's URL
(``<id>/<name>/`` with dashes, named ``django_intents_intent_<name>``), the
message and the log entry. A transition that ends an intent (``cancel``) asks
first, on a page of its own (``confirmation``), from the list and the button alike.
Each moves intents from the states it names (``sources``): ``retry_now`` and
``cancel`` unfinished ones, ``redrive`` (SPEC §14) cancelled ones, so its button
shows on a cancelled intent's page only.

A kind is paused and resumed (SPEC §11) from the summary above the list: one
entry in ``KIND_CHANGES`` gives the button, the URL (``kinds/<name>/``), the
messages and the log entry, which is recorded on the paused kind as a
transition's is on its intents. A target is closed or held (SPEC §14) from
the Targets page (``targets.py``): one entry in ``TARGET_CHANGES`` each, its
log entry recorded on the target's ``TargetState``. Deletion is Django's, on
finished intents only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext, ngettext_lazy

from django_intents.admin.changelist import bounded_count
from django_intents.admin.databases import manager_for
from django_intents.models import Intent, PausedKind, TargetState
from django_intents.rules.batches import INSERT_BATCH
from django_intents.rules.states import ACTIVE, TERMINAL, State
from django_intents.rules.targets import TargetHealth, target_key

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

    Action = Callable[[admin.ModelAdmin[Intent], HttpRequest, QuerySet[Intent]], Any]

CONFIRM_LISTED = 100  # intents named on a confirmation page; past that, "and N more"
TARGET_NAMED = 80  # characters of a target named in a message


@dataclass(frozen=True)
class Transition:
    name: str  # the manager method; also the action's name and the button's URL name
    action: StrPromise  # the description in the list's action menu
    button: StrPromise  # the label on one intent's page
    done: StrPromise  # ngettext_lazy(..., "count"): what changed
    log: str  # the LogEntry change message; untranslated, like Django's own
    to: str  # the state it moves an intent to
    # Asks "are you sure?" on a page of its own first (``confirmation``): it ends intents.
    confirm: StrPromise | None = None
    sources: tuple[str, ...] = ACTIVE  # the states it moves an intent from

    @property
    def path(self) -> str:
        return self.name.replace("_", "-") + "/"


TRANSITIONS = (
    Transition(
        "retry_now",
        gettext_lazy("Retry now"),
        gettext_lazy("Retry now"),
        ngettext_lazy(
            "Scheduled %(count)d intent to run now.",
            "Scheduled %(count)d intents to run now.",
            "count",
        ),
        "Retried now.",
        State.PENDING,
    ),
    Transition(
        "cancel",
        gettext_lazy("Cancel"),
        gettext_lazy("Cancel intent"),
        ngettext_lazy("Cancelled %(count)d intent.", "Cancelled %(count)d intents.", "count"),
        "Cancelled.",
        State.CANCELLED,
        gettext_lazy(
            "Cancel the selected intents? A cancelled intent is not run again "
            "unless it is redriven, with a fresh MAX_ATTEMPTS."
        ),
    ),
    Transition(
        "redrive",
        gettext_lazy("Redrive (cancelled intents only)"),
        gettext_lazy("Redrive"),
        ngettext_lazy(
            "Redrove %(count)d cancelled intent: pending again, due now, "
            "with a fresh MAX_ATTEMPTS.",
            "Redrove %(count)d cancelled intents: pending again, due now, "
            "with a fresh MAX_ATTEMPTS.",
            "count",
        ),
        "Redriven.",
        State.PENDING,
        sources=(State.CANCELLED,),
    ),
)

# Why a transition refused an intent, from its state now: a state it does not
# move from; one it does means the intent moved meanwhile.
_REFUSED = {
    State.COMPLETED: ngettext_lazy(
        "%(count)d already completed", "%(count)d already completed", "count"
    ),
    State.CANCELLED: ngettext_lazy(
        "%(count)d already cancelled", "%(count)d already cancelled", "count"
    ),
    State.PENDING: ngettext_lazy("%(count)d still pending", "%(count)d still pending", "count"),
    State.RUNNING: ngettext_lazy("%(count)d running", "%(count)d running", "count"),
    "moved": ngettext_lazy("%(count)d changed meanwhile", "%(count)d changed meanwhile", "count"),
    "gone": ngettext_lazy("%(count)d no longer exists", "%(count)d no longer exist", "count"),
}


def action(transition: Transition) -> Action:
    """The list action of ``transition``, offered only to users who may change intents."""

    def run(
        modeladmin: admin.ModelAdmin[Intent], request: HttpRequest, queryset: QuerySet[Intent]
    ) -> TemplateResponse | None:
        if transition.confirm and request.POST.get("post") != "yes":
            across = request.POST.get("select_across") == "1"
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            return confirmation(modeladmin, request, transition, queryset, selected, across)
        # Only what the transition and the log need: the selection may be every
        # intent a filter matches.
        apply(modeladmin, request, dict(queryset.order_by().values_list("pk", "kind")), transition)
        return None

    run.__name__ = run.__qualname__ = transition.name
    return admin.action(description=transition.action, permissions=["change"])(run)


def confirmation(
    modeladmin: admin.ModelAdmin[Intent],
    request: HttpRequest,
    transition: Transition,
    queryset: QuerySet[Intent],
    selected: Sequence[str],
    across: bool = False,
) -> TemplateResponse:
    """The page that asks before ``transition`` runs, as Django's ``delete_selected`` does:
    the intents it names (the first ``CONFIRM_LISTED``), and a form that posts the same
    selection back with ``post=yes``.

    Nothing changes until that second POST. A selection of every intent the filters
    match (``across``) is posted back as such, to the same URL, so that the filters
    choose the intents again then; its count is ``changelist.bounded_count``'s.
    """
    count, exact = bounded_count(queryset)
    listed = list(
        queryset.order_by("-created_at", "-id").only("id", "kind", "target", "state")[
            :CONFIRM_LISTED
        ]
    )
    hidden = [(ACTION_CHECKBOX_NAME, pk) for pk in selected]
    hidden += [("select_across", "1")] if across else []
    opts = modeladmin.opts
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Are you sure?"),
        "subtitle": None,
        "opts": opts,
        "media": modeladmin.media,
        "question": transition.confirm,
        "button": transition.button,
        "action": transition.name,
        "intents": listed,
        "count": count,
        "exact": exact,
        "more": max(count - len(listed), 0),
        "hidden": hidden,
    }
    template = f"admin/{opts.app_label}/{opts.model_name}/confirm_transition.html"
    return TemplateResponse(request, template, context)


def apply(
    modeladmin: admin.ModelAdmin[Intent],
    request: HttpRequest,
    selection: Mapping[str, str],
    transition: Transition,
) -> None:
    """Run the transition on the selected intents (id to kind) and report what changed and
    what did not: ``retry_now_many``, ``cancel_many`` or ``redrive_many``, one statement
    per ``INSERT_BATCH``."""
    manager = manager_for(request)
    moved = set(getattr(manager, f"{transition.name}_many")(selection))
    if moved:
        # The log names each intent as it is now.
        changed = [
            Intent(pk=pk, kind=kind, state=transition.to)
            for pk, kind in selection.items()
            if pk in moved
        ]
        _log(request, changed, transition.log)
        done = transition.done % {"count": len(changed)}
        modeladmin.message_user(request, done, messages.SUCCESS)
    skipped = [pk for pk in selection if pk not in moved]
    if skipped:
        message = skipped_message(skipped, transition.sources, using=manager.db)
        modeladmin.message_user(request, message, messages.WARNING)


def skipped_message(
    ids: Sequence[str], sources: Sequence[str] = ACTIVE, *, using: str | None = None
) -> str:
    """Say why intents were not changed by a transition from the states ``sources``, from
    their state now (one query per ``INSERT_BATCH``)."""
    states: Counter[str] = Counter()
    for start in range(0, len(ids), INSERT_BATCH):
        chunk = ids[start : start + INSERT_BATCH]
        rows = Intent.objects.using(using).filter(pk__in=chunk)
        states.update(rows.values_list("state", flat=True))
    counts = {state: states[state] for state in _REFUSED if state not in sources}
    counts["moved"] = sum(states[state] for state in sources)
    counts["gone"] = len(ids) - states.total()
    reasons = [_REFUSED[why] % {"count": count} for why, count in counts.items() if count]
    return ngettext(
        "Skipped %(count)d intent: %(reasons)s.",
        "Skipped %(count)d intents: %(reasons)s.",
        len(ids),
    ) % {"count": len(ids), "reasons": ", ".join(reasons)}


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


def change_kind(
    modeladmin: admin.ModelAdmin[Intent], request: HttpRequest, change: KindChange, kind: str
) -> None:
    """Pause or resume ``kind`` and report it; a kind the manager refuses is an error message."""
    try:
        changed = getattr(manager_for(request), change.name)(kind)
    except ValueError as exc:
        modeladmin.message_user(request, str(exc), messages.ERROR)
        return
    if not changed:
        modeladmin.message_user(request, change.unchanged % {"kind": kind}, messages.WARNING)
        return
    _log(request, [PausedKind(kind=kind, paused_at=timezone.now())], change.log)
    modeladmin.message_user(request, change.done % {"kind": kind}, messages.SUCCESS)


@dataclass(frozen=True)
class TargetChange:
    name: str  # the manager method; also the value of the Targets page's ``action`` field
    button: StrPromise
    done: StrPromise  # "%(kind)s", "%(target)s", "%(seconds)s": what changed
    unchanged: StrPromise  # the same: nothing to do
    log: str  # "%(seconds)s": the LogEntry change message; untranslated, like Django's own
    to: TargetHealth
    seconds: bool = False  # takes the Targets page's ``seconds`` field


TARGET_CHANGES = (
    TargetChange(
        "close_target",
        gettext_lazy("Close now"),
        gettext_lazy(
            "Closed target “%(target)s” of kind “%(kind)s”: pools claim its intents again "
            "at their next claim."
        ),
        gettext_lazy("Target “%(target)s” of kind “%(kind)s” was already healthy."),
        "Closed.",
        TargetHealth.CLOSED,
    ),
    TargetChange(
        "open_target",
        gettext_lazy("Hold for…"),
        gettext_lazy(
            "Held target “%(target)s” of kind “%(kind)s” for %(seconds)s s: no pool claims "
            "its intents until then."
        ),
        gettext_lazy("Target “%(target)s” of kind “%(kind)s” was already held until then."),
        "Held for %(seconds)s s.",
        TargetHealth.HELD,
        seconds=True,
    ),
)


def change_target(
    modeladmin: admin.ModelAdmin[Intent],
    request: HttpRequest,
    change: TargetChange,
    kind: str,
    target: str,
    seconds: str | None = None,
) -> None:
    """Close or hold (kind, target) and report it; what the manager refuses (a blank
    target, seconds that are not a positive number) is an error message, nothing written."""
    names = {"kind": kind, "target": Truncator(target).chars(TARGET_NAMED), "seconds": seconds}
    args: list[object] = [kind, target]
    if change.seconds:
        try:
            number = float(seconds or "")
        except ValueError:
            message = _("Hold for: “%(seconds)s” is not a number of seconds.") % names
            modeladmin.message_user(request, message, messages.ERROR)
            return
        names["seconds"] = f"{number:g}"
        args.append(number)
    try:
        changed = getattr(manager_for(request), change.name)(*args)
    except (TypeError, ValueError) as exc:
        modeladmin.message_user(request, str(exc), messages.ERROR)
        return
    if not changed:
        modeladmin.message_user(request, change.unchanged % names, messages.WARNING)
        return
    key = target_key(kind, target)
    _log(
        request,
        [TargetState(key=key, kind=kind, target=target, state=change.to)],
        change.log % names,
    )
    modeladmin.message_user(request, change.done % names, messages.SUCCESS)


@admin.action(
    description=gettext_lazy("Delete selected completed or cancelled intents"),
    permissions=["delete"],
)
def delete_selected(
    modeladmin: admin.ModelAdmin[Intent], request: HttpRequest, queryset: QuerySet[Intent]
) -> TemplateResponse | None:
    """Django's delete action, on the finished part of the selection only."""
    active = queryset.filter(state__in=ACTIVE).count()
    if active:
        modeladmin.message_user(
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
    finished = queryset.filter(state__in=TERMINAL)
    if not finished.exists():
        return None
    return django_delete_selected(modeladmin, request, finished)


def _log(request: HttpRequest, changed: Sequence[models.Model], message: str) -> None:
    """One ``CHANGE`` entry in the admin's history per object ``changed``."""
    LogEntry.objects.log_actions(
        user_id=cast(int, request.user.pk),  # admin views require a logged-in user
        queryset=changed,
        action_flag=CHANGE,
        change_message=message,
    )
