"""The intents list on a table of millions: filters, counts, search and order that cost
what the page shows, not what the table holds.

- The kind filter lists the kinds from an index, one lookup per kind
  (``store.admin.kinds``), where Django's would read every row's kind.
- Counts are exact up to ``EXACT`` rows; past that the list says "about" and
  shows the planner's estimate (``store.admin.estimate``). Where the database
  keeps no estimates (SQLite), it counts every row.
- Search tries what an index answers first: an id beginning with the text,
  and an event id equal to it (one lookup per kind and state in the
  ``(kind, state, event_id)`` index). Only when neither finds anything does
  it look for the text inside event ids and targets, which reads the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Page, Paginator
from django.db import connections, router
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_intents.admin.databases import chosen
from django_intents.models import Intent
from django_intents.rules.states import ALL
from django_intents.store import backend_for
from django_intents.store.admin import estimate
from django_intents.store.admin import kinds as kinds_in_table

# Counting this many rows is cheap on any database (docs/benchmarks.md, "The admin
# on a big table"); past it a page shows the planner's estimate.
EXACT = 1_000
# Pages that skip at least this many rows find their ids first (CountingPaginator.page).
DEFERRED_FROM = 1_000
TARGET_CHOICE = 40  # characters of the chosen target in the filter

if TYPE_CHECKING:
    _Paginator = Paginator[Intent]
else:  # Django's Paginator takes no type argument at run time
    _Paginator = Paginator


def present_kinds(using: str | None = None) -> list[str]:
    """Every kind in the table, in order, without reading it."""
    alias = using or router.db_for_read(Intent)
    return kinds_in_table(backend_for(connections[alias], Intent))


def exceeds_bound(queryset: QuerySet[Any], kinds: list[str] | None = None) -> bool:
    """Whether ``queryset`` has more than ``EXACT`` rows; it reads at most one more."""
    return _counted(queryset, kinds) > EXACT


def bounded_count(queryset: QuerySet[Any], kinds: list[str] | None = None) -> tuple[int, bool]:
    """``(count, exact)``: exact up to ``EXACT`` rows, else the planner's estimate
    (never below ``EXACT``). Where there is no estimate, the exact count.

    ``kinds`` are the kinds in the table (``present_kinds``), read if not given.
    """
    counted = _counted(queryset, kinds)
    if counted <= EXACT:
        return counted, True
    guess = estimate(queryset)
    if guess is None:
        return queryset.count(), True
    return max(guess, counted), False


def _counted(queryset: QuerySet[Any], kinds: list[str] | None) -> int:
    """Up to ``EXACT + 1`` rows of ``queryset``, counted.

    Through every kind in the table, which selects nothing more: a filter by
    state then reads each kind's entries of that state in the ``(kind, state,
    event_id)`` index, where PostgreSQL would otherwise walk the index from
    its start past every kind's finished entries.
    """
    if kinds is None:
        kinds = present_kinds(queryset.db)
    return queryset.filter(kind__in=kinds).order_by()[: EXACT + 1].count()


class CountingPaginator(_Paginator):
    """Django's paginator, with ``bounded_count`` (``exact`` says which count it shows),
    and deep pages found by their ids first.

    Page 500 skips 49,900 rows. Selecting only their primary keys, in the
    list's order, reads ``intents_created_idx`` alone (an index-only scan on
    PostgreSQL); the page's rows are then read by primary key.
    """

    exact = True
    counted_on: str | None = None  # the replica that counts (READ_DATABASE), if any

    @cached_property
    def count(self) -> int:
        if not isinstance(self.object_list, QuerySet):  # a list: nothing to bound
            return len(self.object_list)
        rows = self.object_list
        count, self.exact = bounded_count(rows.using(self.counted_on or rows.db))
        return count

    def page(self, number: Any) -> Page[Intent]:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if bottom < DEFERRED_FROM or not isinstance(self.object_list, QuerySet):
            return super().page(number)
        ids = self.object_list.values_list("pk", flat=True)[bottom : bottom + self.per_page]
        return Page(self.object_list.filter(pk__in=list(ids)), number, self)


class _Filter(admin.SimpleListFilter):
    """A list filter by ``parameter_name``: its ``options`` to choose from, and the rows
    ``where(value)`` selects for the chosen one."""

    def options(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def where(self, value: str) -> Q:
        raise NotImplementedError

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return self.options()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Intent]) -> QuerySet[Intent]:
        value = self.value()
        return queryset.filter(self.where(value)) if value else queryset


class KindFilter(_Filter):
    """By kind, from the kinds in the table (``?kind=``, as Django's own filter spells it)."""

    title = gettext_lazy("kind")
    parameter_name = "kind"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in present_kinds(chosen(request))]

    def where(self, value: str) -> Q:
        return Q(kind=value)


class LastErrorFilter(_Filter):
    """Failing intents: pending ones waiting to retry after an error, or cancelled with one."""

    title = gettext_lazy("last error")
    parameter_name = "error"
    selects = {"yes": ~Q(last_error=""), "no": Q(last_error="")}

    def options(self) -> list[tuple[str, str]]:
        return [("yes", _("Has an error")), ("no", _("No error"))]

    def where(self, value: str) -> Q:
        return self.selects.get(value, Q())  # any other value selects every row


class TargetFilter(_Filter):
    """By target (``?target=``), as the Targets page links to it: shown only once chosen,
    since the targets are too many to offer (and no index lists them)."""

    title = gettext_lazy("target")
    parameter_name = "target"

    def options(self) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, Truncator(value).chars(TARGET_CHOICE))] if value else []

    def where(self, value: str) -> Q:
        return Q(target=value)


def search(queryset: QuerySet[Intent], text: str) -> QuerySet[Intent]:
    """The intents ``text`` names: by id prefix or event id through indexes, else by
    ``text`` inside an event id or a target (a scan of what the filters left)."""
    text = text.strip()
    if not text:
        return queryset
    # Ids are lower-case hashes: an id copied in capitals finds its intent too.
    named = _id_prefix(text) | _id_prefix(text.lower())
    named |= Q(kind__in=present_kinds(queryset.db), state__in=ALL, event_id=text)
    found = queryset.filter(named)
    if found.exists():
        return found
    return queryset.filter(Q(event_id__icontains=text) | Q(target__icontains=text))


def _id_prefix(text: str) -> Q:
    """Ids that begin with ``text``: a range the primary key serves whatever the
    collation, narrowed to an exact prefix match."""
    prefix = Q(pk__gte=text, pk__startswith=text)
    if text[-1] < chr(0x10FFFF):
        prefix &= Q(pk__lt=text[:-1] + chr(ord(text[-1]) + 1))
    return prefix


class IntentChangeList(ChangeList):
    """Sorting by "next run" or by priority is the claim order: ties broken as the
    claim breaks them."""

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
        elif ordering and ordering[0] in ("priority", "-priority"):
            # By priority, then as the claim takes equal priorities.
            sign = "-" if ordering[0] == "priority" else ""
            ordering = [ordering[0], f"{sign}next_at", f"{sign}created_at", f"{sign}id"]
        return ordering

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: Any = None
    ) -> QuerySet[Intent]:
        # Payloads can be large and the list never shows them.
        return super().get_queryset(request, exclude_parameters).defer("payload")
