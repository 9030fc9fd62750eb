"""``manage.py intents_pause KIND...``: stop every pool from claiming these kinds.

Pools learn of a pause at their next claim; the attempts already running
finish normally and enqueue keeps recording. ``intents_resume`` is the same
command the other way round.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_intents.handlers import check_kind
from django_intents.management.options import add_databases, chosen_databases
from django_intents.management.schema import require_table
from django_intents.managers import IntentManager
from django_intents.models import Intent
from django_intents.rules.identity import check_text


class Command(BaseCommand):
    help = (
        "Pause kinds: no pool claims their intents from its next claim on. Attempts already "
        "running finish normally, and enqueue still records. Undo with intents_resume."
    )
    done, unchanged = "paused", "already paused"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("kinds", nargs="+", metavar="KIND", help="a kind of intent")
        add_databases(parser)

    def handle(
        self,
        *args: Any,
        kinds: list[str],
        database: list[str] | None,
        all_databases: bool,
        **options: Any,
    ) -> None:
        aliases = chosen_databases(database, all_databases)
        for kind in kinds:  # every kind is checked before anything is written
            try:
                check_text("kind", kind)
            except ValueError as exc:
                raise CommandError(f"bad kind {kind!r}: {exc}; nothing was changed") from None
        for using in aliases:
            require_table(using)
        for using in aliases:  # several databases (issue 41): the kinds on each, named
            manager = Intent.objects.db_manager(using)
            where = f" (database {using})" if len(aliases) > 1 else ""
            for kind in dict.fromkeys(kinds):
                changed = self.change(manager, kind)
                self.stdout.write(f"{kind}: {self.done if changed else self.unchanged}{where}")
        for kind in dict.fromkeys(kinds):
            try:
                check_kind(kind)
            except ValueError:
                self.stderr.write(f"warning: no handler in this project runs {kind!r}")

    def change(self, manager: IntentManager, kind: str) -> bool:
        return manager.pause(kind)
