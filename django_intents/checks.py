"""System checks: a bad ``INTENTS`` setting fails ``manage.py check`` and start-up."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from .conf import parse


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
