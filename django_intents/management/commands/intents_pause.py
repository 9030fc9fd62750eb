"""``manage.py intents_pause KIND...``: stop every pool from claiming these kinds.

Pools learn of a pause at their next claim; the attempts already running
finish normally and enqueue keeps recording. ``intents_resume`` is the same
command the other way round.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections, router

from ...handlers import check_kind
from ...identity import check_text
from ...managers import IntentManager
from ...models import Intent
from ...schema import require_table


class Command(BaseCommand):
    help = (
        "Pause kinds: no pool claims their intents from its next claim on. Attempts already "
        "running finish normally, and enqueue still records. Undo with intents_resume."
    )
    done, unchanged = "paused", "already paused"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("kinds", nargs="+", metavar="KIND", help="a kind of intent")
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="the database alias of the queue (default: the router's choice)",
        )

    def handle(self, *args: Any, kinds: list[str], database: str | None, **options: Any) -> None:
        if database is not None and database not in connections:
            raise CommandError(f"unknown database alias {database!r}")
        using = database or router.db_for_write(Intent)
        for kind in kinds:  # every kind is checked before anything is written
            try:
                check_text("kind", kind)
            except ValueError as exc:
                raise CommandError(f"bad kind {kind!r}: {exc}; nothing was changed") from None
        require_table(using)
        manager = Intent.objects.db_manager(using)
        for kind in dict.fromkeys(kinds):
            changed = self.change(manager, kind)
            self.stdout.write(f"{kind}: {self.done if changed else self.unchanged}")
            try:
                check_kind(kind)
            except ValueError:
                self.stderr.write(f"warning: no handler in this project runs {kind!r}")

    def change(self, manager: IntentManager, kind: str) -> bool:
        return manager.pause(kind)
