"""Which database the admin looks at, when the queue lives on several (issue 41).

With ``INTENTS["DATABASES"]`` listing several aliases, every page of the
intents' admin (the list, one intent, the dashboard, the Targets page) and
every button on them act on one database: the one this user chose, kept in
the session, or else the one the routers pick for reading ``Intent``. Each
page says which, and offers the others (``database.html``). With one
database nothing changes but the line that names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connections, router
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

from django_intents.conf import get_settings
from django_intents.managers import IntentManager
from django_intents.models import Intent
from django_intents.store import backend_for
from django_intents.store.replicas import replica_lag

SESSION_KEY = "django_intents_database"


def choices() -> tuple[str, ...]:
    """The databases the admin may show: ``INTENTS["DATABASES"]``, else the routers' one."""
    listed = get_settings().databases
    return listed if listed is not None else (router.db_for_read(Intent),)


def chosen(request: HttpRequest) -> str:
    """The database this request's pages read and change."""
    options = choices()
    session = getattr(request, "session", None)
    alias = session.get(SESSION_KEY) if session is not None else None
    if alias in options:
        return str(alias)
    default = router.db_for_read(Intent)
    return default if default in options else options[0]


def counted(request: HttpRequest) -> str:
    """The database this request's counts read: the chosen one's replica, if
    ``INTENTS["READ_DATABASE"]`` names one (its rows and buttons stay on the primary)."""
    return get_settings().read_alias(chosen(request))


@dataclass(frozen=True)
class Replica:
    """What a page says of the replica its counts came from (``replica.html``)."""

    alias: str
    replaying: bool
    seconds: float | None
    known: bool = True  # False: the server would not say (a privilege, an outage)


def replica(request: HttpRequest) -> Replica | None:
    """The replica this request's counts read, with how far behind it is; ``None``
    when they read the primary."""
    alias = counted(request)
    if alias == chosen(request):
        return None
    try:
        lag = replica_lag(backend_for(connections[alias], Intent))
    except DatabaseError:
        return Replica(alias, replaying=False, seconds=None, known=False)
    return Replica(alias, lag.replaying, lag.seconds)


def manager_for(request: HttpRequest) -> IntentManager:
    """``Intent.objects`` on the chosen database: the buttons' transitions go there."""
    return Intent.objects.db_manager(chosen(request))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Shown:
    """What a page says of its database (``database.html``)."""

    alias: str
    vendor: str
    others: tuple[str, ...]
    switch_url: str


def shown(modeladmin: admin.ModelAdmin[Intent], request: HttpRequest) -> Shown:
    alias = chosen(request)
    opts = modeladmin.opts
    url = reverse(f"{modeladmin.admin_site.name}:{opts.app_label}_{opts.model_name}_database")
    others = tuple(choice for choice in choices() if choice != alias)
    return Shown(alias, connections[alias].display_name, others, url)


def database_view(modeladmin: admin.ModelAdmin[Intent], request: HttpRequest) -> HttpResponse:
    """The switch's POST: show another of the queue's databases, then back where it was."""
    if not modeladmin.has_view_permission(request):
        raise PermissionDenied
    alias = request.POST.get("database", "")
    if alias in choices():
        request.session[SESSION_KEY] = alias
        modeladmin.message_user(
            request, _("Showing the intents of database “%(alias)s”.") % {"alias": alias}
        )
    else:
        modeladmin.message_user(
            request,
            _("“%(alias)s” is not one of the queue's databases (INTENTS['DATABASES']).")
            % {"alias": alias},
            messages.ERROR,
        )
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    if not safe:
        opts = modeladmin.opts
        back = reverse(
            f"{modeladmin.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
        )
    return HttpResponseRedirect(back)
