"""``manage.py intents_redrive``: run cancelled intents again, with a fresh budget (SPEC §14)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext

from django_intents.management.options import add_databases, chosen_databases, instant, text_of
from django_intents.management.progress import Progress, raw
from django_intents.managers import IntentManager
from django_intents.models import Intent


class Command(BaseCommand):
    help = (
        "Make cancelled intents pending again, due now, with a fresh MAX_ATTEMPTS: every one "
        "that matches the options (all of them without any). Ids, payloads, attempts and "
        "last errors are kept. Works in batches of 500, each its own transaction."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", type=text_of("kind"), help="only intents of this kind")
        parser.add_argument("--target", type=text_of("target"), help="only intents for this target")
        parser.add_argument(
            "--since",
            type=instant,
            metavar="ISO8601",
            help="only intents cancelled at or after this time (without an offset: TIME_ZONE)",
        )
        parser.add_argument(
            "--until",
            type=instant,
            metavar="ISO8601",
            help="only intents cancelled before this time (without an offset: TIME_ZONE)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be redriven; change nothing"
        )
        add_databases(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        aliases = chosen_databases(options["database"], options["all_databases"])
        since, until = options["since"], options["until"]
        if since is not None and until is not None and since >= until:
            raise CommandError(f"--since ({since}) must be earlier than --until ({until})")
        for alias in aliases:
            if len(aliases) > 1:  # several databases (issue 41): each redriven in turn
                self.stdout.write(f"database {alias}:")
            self.redrive(Intent.objects.db_manager(alias), options)

    def redrive(self, manager: IntentManager, options: dict[str, Any]) -> None:
        """Redrive what ``options`` match on ``manager``'s database, reporting as it goes."""
        match = {
            "kind": options["kind"],
            "target": options["target"],
            "finished_after": options["since"],
            "finished_before": options["until"],
        }
        total = manager.redrivable(**match).count()
        if options["dry_run"]:
            self.stdout.write(
                ngettext(
                    "%(count)d cancelled intent would be redriven.",
                    "%(count)d cancelled intents would be redriven.",
                    total,
                )
                % {"count": total}
            )
            self.stdout.write("Dry run: nothing was changed.")
            return
        progress = Progress(
            description="redriving",
            unit="intents",
            stream=raw(self.stdout),
            total=total,
            write=self.stdout.write,
        )
        try:
            done = manager.redrive(**match, progress=progress.advance)
        finally:
            progress.close()
        self.stdout.write(
            ngettext(
                "Redrove %(count)d cancelled intent: pending again, due now.",
                "Redrove %(count)d cancelled intents: pending again, due now.",
                done,
            )
            % {"count": done}
        )
