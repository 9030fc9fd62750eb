"""``manage.py intents_health [--max-age S]``: fail when the queue is not being worked.

For container probes and cron alerts. It asks the one question that catches a
dead pool, a pool too small for its load and a handler that blocks every
worker alike: how long has the oldest due intent been waiting? And one that no
pool can answer by working harder: are intents due of a kind that no handler
in this project runs (and that ``INTENTS["EXTERNAL_KINDS"]`` does not list)?
The due intents of a paused kind wait on purpose: they are named, not stuck.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_intents.handlers import unhandled
from django_intents.management.options import add_database, age_seconds, chosen_database
from django_intents.management.schema import require_table
from django_intents.observability.backlog import Backlog, read_backlog
from django_intents.rules.states import State
from django_intents.store.clock import server_now


class Command(BaseCommand):
    help = (
        "Exit non-zero when the oldest due intent (pending and due, or running with an "
        "expired lease) has waited longer than --max-age seconds, or when intents are due "
        "of a kind that no handler in this project runs."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--max-age",
            type=age_seconds,
            default=300.0,
            metavar="SECONDS",
            help="longest acceptable wait of a due intent (default 300)",
        )
        add_database(parser)

    def handle(self, *args: Any, max_age: float, database: str | None, **options: Any) -> None:
        using = chosen_database(database)
        require_table(using)
        now = server_now(using)
        backlog = read_backlog(now, using=using)
        paused = [k for k in backlog.kinds if k.paused]
        if paused:
            named = ", ".join(f"{k.kind!r} ({k.due} due)" for k in paused)
            self.stdout.write(f"paused: {named}; not counted as stuck")
        self.check_handled(backlog)
        pending = backlog.states[State.PENDING]
        waits = {
            k.kind: now - k.oldest_due
            for k in backlog.kinds
            if k.oldest_due is not None and not k.paused
        }
        if not waits:
            self.stdout.write(f"ok: nothing is due ({pending} pending, max age {max_age:g}s)")
            return
        kind = max(waits, key=waits.__getitem__)
        age = waits[kind].total_seconds()
        summary = (
            f"oldest due intent (kind {kind!r}) has waited {age:.0f}s; "
            f"{len(waits)} kind(s) with due intents, {pending} pending"
        )
        if age > max_age:
            raise CommandError(
                f"stuck: {summary}; more than --max-age {max_age:g}s. "
                "Are workers running for this kind, and are they keeping up?",
                returncode=1,
            )
        self.stdout.write(f"ok: {summary} (max age {max_age:g}s)")

    def check_handled(self, backlog: Backlog) -> None:
        orphans = unhandled({kind.kind: kind.due for kind in backlog.kinds})
        if orphans:
            named = ", ".join(f"{kind!r} ({n} due)" for kind, n in orphans.items())
            raise CommandError(
                f"unhandled: intents are due of kind(s) that no handler in this project runs: "
                f"{named}. Register a handler for each kind, list it in "
                "INTENTS['EXTERNAL_KINDS'] if another service runs it, or cancel the intents.",
                returncode=1,
            )
