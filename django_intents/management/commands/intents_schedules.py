"""``manage.py intents_schedules``: one line per schedule, with its last and next slot.

The last slot is the latest slot intent in the table, whatever its state;
the next one is the first slot that starts after now. Both are UTC, in the
form slot event ids use, so a line can be matched with the intents it names;
``-`` when there is none.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from django_intents.maintenance.schedules import listing
from django_intents.management.options import add_databases, chosen_databases
from django_intents.management.schema import require_table


class Command(BaseCommand):
    help = (
        "List INTENTS['SCHEDULES']: name, cron, time zone, last slot and next slot (UTC). "
        "Every pool enqueues the due slots of the schedules whose kind it runs."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_databases(parser)

    def handle(
        self, *args: Any, database: list[str] | None, all_databases: bool, **options: Any
    ) -> None:
        aliases = chosen_databases(database, all_databases)
        for alias in aliases:
            if len(aliases) > 1:  # several databases (issue 41): the schedules each holds
                self.stdout.write(f"database {alias}:")
            self.list_schedules(alias)

    def list_schedules(self, using: str) -> None:
        require_table(using)
        rows = listing(using=using)
        if not rows:
            self.stdout.write("no schedules (INTENTS['SCHEDULES'] is empty)")
            return
        for row in rows:  # tab-separated: a cron expression has spaces of its own
            s, last, upcoming = row.schedule, row.last_utc or "-", row.next_utc or "-"
            self.stdout.write("\t".join([s.name, s.cron, s.tz, last, upcoming]))
