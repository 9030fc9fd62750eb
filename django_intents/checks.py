"""System checks: a bad ``INTENTS`` setting or handler fails ``manage.py check`` and start-up."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from django_intents.conf import get_settings, parse
from django_intents.handlers import check_kind, problems
from django_intents.routers import TargetShardRouter

SCHEDULE_KIND = "django_intents.E008"


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    _, errors = parse(getattr(settings, "INTENTS", None))
    return [
        Error(
            str(error),
            hint="See the INTENTS settings in the django-intents documentation.",
            obj=f"INTENTS[{error.key!r}]",
            id=error.check_id,
        )
        for error in errors
    ]


@register()
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Import every handler now, so a broken one fails the deploy, not its first intent."""
    _, errors = parse(getattr(settings, "INTENTS", None))
    if errors:
        return []  # check_settings reports them; the handlers cannot be read meanwhile
    return [
        Error(problem.message, hint=problem.hint, obj=problem.obj, id=problem.check_id)
        for problem in problems()
    ]


@register()
def check_schedule_kinds(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A schedule whose kind nothing runs would fill the table with slots no pool claims."""
    _, errors = parse(getattr(settings, "INTENTS", None))
    if errors:
        return []
    found: list[CheckMessage] = []
    for name, schedule in get_settings().schedules.items():
        try:
            check_kind(schedule.kind)
        except ValueError as exc:
            found.append(
                Error(
                    f"INTENTS['SCHEDULES'][{name!r}]: {exc}",
                    hint="Fix the schedule's kind, or register a handler for it.",
                    obj=f"INTENTS['SCHEDULES'][{name!r}]",
                    id=SCHEDULE_KIND,
                )
            )
    return found


SHARDS_UNSET = "django_intents.E012"


@register()
def check_shard_router(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``TargetShardRouter`` spreads targets over ``INTENTS["DATABASES"]``: without it,
    every enqueue would fail, so the deploy fails instead."""
    _, errors = parse(getattr(settings, "INTENTS", None))
    if errors or get_settings().databases is not None:
        return []
    routers = getattr(settings, "DATABASE_ROUTERS", [])
    named = f"{TargetShardRouter.__module__}.{TargetShardRouter.__qualname__}"
    if not any(r == named or isinstance(r, TargetShardRouter) for r in routers):
        return []
    return [
        Error(
            "DATABASE_ROUTERS has TargetShardRouter, but INTENTS['DATABASES'] is not set",
            hint="List the database aliases to spread targets over in INTENTS['DATABASES'].",
            obj="INTENTS['DATABASES']",
            id=SHARDS_UNSET,
        )
    ]
