"""``TargetShardRouter``: each target's intents on one of ``INTENTS["DATABASES"]``.

Django's routers decide which database a model's rows go to; the manager asks
them for every intent it records, with the intent's ``kind``, ``target`` and
``id`` as hints (``Intent.objects.enqueue``). This router answers with
``rules/shards.shard_of``: a stable digest of the target over the configured
aliases, so that a target's limits, breaker, pace and order are counted on
the one database that holds all of its intents.

A project that shards by tenant (the outbox: the intent in the database and
the transaction of the business row) writes its own router instead and reads
the same hints. Reads carry no target: read a shard with ``.using(alias)``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model

from django_intents.conf import get_settings
from django_intents.rules.shards import shard_of

APP = "django_intents"


class TargetShardRouter:
    """Route the writes of intents by target; migrate the app on every configured alias."""

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        if model._meta.app_label != APP or not isinstance(hints.get("target"), str):
            return None
        return shard_of(hints["target"], self._aliases())

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label != APP:
            return None
        return db in self._aliases()

    def _aliases(self) -> tuple[str, ...]:
        aliases = get_settings().databases
        if aliases is None:
            raise ImproperlyConfigured(
                "TargetShardRouter needs INTENTS['DATABASES']: the aliases to spread targets over"
            )
        return aliases
