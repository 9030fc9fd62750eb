"""``manage.py prune_intents``: apply ``INTENTS["RETENTION"]`` once, for cron."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_intents.conf import get_settings
from django_intents.maintenance.retention import prune, to_prune
from django_intents.management.options import add_databases, chosen_databases, positive_int
from django_intents.management.progress import Progress, raw
from django_intents.rules.states import TERMINAL


class Command(BaseCommand):
    help = (
        "Compact and delete old completed/cancelled intents as INTENTS['RETENTION'] says, "
        "in bounded batches. Pending and running intents are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be compacted and deleted; change nothing.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=500,
            help="Rows per statement (default 500): each batch holds its locks briefly.",
        )
        parser.add_argument(
            "--max-batches",
            type=positive_int,
            default=None,
            help="Stop after this many batches; the next run continues (default: no limit).",
        )
        add_databases(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        aliases = chosen_databases(options["database"], options["all_databases"])
        if not get_settings().retention:
            self.stdout.write("INTENTS['RETENTION'] is not set: every intent is kept.")
            return
        for alias in aliases:
            if len(aliases) > 1:  # several databases (issue 41): each pruned in turn
                self.stdout.write(f"database {alias}:")
            self.prune_database(alias, options)

    def prune_database(self, using: str, options: dict[str, Any]) -> None:
        """Prune one database's terminal intents as ``RETENTION`` says, reporting as it goes."""
        total = to_prune(using=using)
        if options["max_batches"] is not None:
            total = min(total, options["max_batches"] * options["batch_size"])
        progress = Progress(
            description="counting" if options["dry_run"] else "pruning",
            unit="rows",
            stream=raw(self.stdout),
            total=total,
            write=self.stdout.write,
        )
        try:
            report = prune(
                batch_size=options["batch_size"],
                max_batches=options["max_batches"],
                dry_run=options["dry_run"],
                using=using,
                progress=progress.advance,
            )
        finally:
            progress.close()
        would = "would be " if report.dry_run else ""
        for state in TERMINAL:
            if state not in report.compacted and state not in report.deleted:
                continue
            parts = []
            if state in report.compacted:
                parts.append(f"{report.compacted[state]} {would}compacted")
            if state in report.deleted:
                parts.append(f"{report.deleted[state]} {would}deleted")
            self.stdout.write(f"{state}: {', '.join(parts)}")
        if report.dry_run:
            self.stdout.write("Dry run: nothing was changed.")
        if not report.finished:
            batches = "1 batch" if report.batches == 1 else f"{report.batches} batches"
            self.stdout.write(
                self.style.WARNING(
                    f"Stopped after {batches} (--max-batches); run again to continue."
                )
            )
