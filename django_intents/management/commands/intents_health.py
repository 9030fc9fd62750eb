"""``manage.py intents_health [--max-age S] [--max-running S]``: fail when the queue is not
being worked.

For container probes and cron alerts. It asks the one question that catches a
dead pool, a pool too small for its load and a handler that blocks every
worker alike: how long has the oldest due intent been waiting? And one that no
pool can answer by working harder: are intents due of a kind that no handler
in this project runs (and that ``INTENTS["EXTERNAL_KINDS"]`` does not list)?
The due intents of a paused kind wait on purpose: they are named, not stuck.
So do those of a target that is held, open or half-open (SPEC §14): the
targets are listed, and the oldest due intent is looked for among the other
targets of the kind (one more query, only for a kind that would fail).

With ``--max-running``, a third: has an attempt been running longer than that?
A hung handler's pool renews its lease for ever, so the due age never sees it.
An attempt is timed from its intent's ``next_at``, when it became due, by the
database's clock (``observability.backlog``'s "running since": the table keeps
no time of the claim), so a wait for a worker before the claim counts too.
"""

from __future__ import annotations

import argparse
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Min
from django.utils.text import Truncator

from django_intents.handlers import unhandled
from django_intents.management.options import add_databases, age_seconds, chosen_databases
from django_intents.management.schema import require_table
from django_intents.models import Intent
from django_intents.observability.backlog import Backlog, read_backlog
from django_intents.rules import states
from django_intents.rules.states import State
from django_intents.rules.targets import TargetRow
from django_intents.store.clock import server_now

NAMED = 10  # intents a failing --max-running names, targets listed; the rest are counted
TARGET_SHOWN = 80  # characters of a listed target


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
        parser.add_argument(
            "--max-running",
            type=age_seconds,
            default=None,
            metavar="SECONDS",
            help="longest acceptable attempt, timed from when its intent became due "
            "(next_at), a wait for a worker included (default: no limit)",
        )
        add_databases(parser)

    def handle(
        self,
        *args: Any,
        max_age: float,
        max_running: float | None,
        database: list[str] | None,
        all_databases: bool,
        **options: Any,
    ) -> None:
        aliases = chosen_databases(database, all_databases)
        if len(aliases) == 1:
            self.check_database(aliases[0], max_age, max_running)
            return
        # Several databases (issue 41): each is checked and reported; the command
        # fails naming every database that failed.
        failures: list[CommandError] = []
        for alias in aliases:
            self.stdout.write(f"database {alias}:")
            try:
                self.check_database(alias, max_age, max_running)
            except CommandError as exc:
                self.stdout.write(f"  {exc}")
                failures.append(CommandError(f"database {alias}: {exc}", returncode=exc.returncode))
        if failures:
            raise CommandError(
                "; ".join(str(f) for f in failures), returncode=max(f.returncode for f in failures)
            )

    def check_database(self, using: str, max_age: float, max_running: float | None) -> None:
        """One database's answer: returns when it is healthy, raises ``CommandError`` if not."""
        require_table(using)
        now = server_now(using)
        backlog = read_backlog(now, using=using)
        if max_running is not None:
            self.check_running(backlog, max_running, using)
        paused = [k for k in backlog.kinds if k.paused]
        if paused:
            named = ", ".join(f"{k.kind!r} ({k.due} due)" for k in paused)
            self.stdout.write(f"paused: {named}; not counted as stuck")
        self.check_handled(backlog)
        waiting = [row for row in Intent.objects.db_manager(using).targets(now=now) if row.blocking]
        blocked: dict[str, list[str]] = {}
        for row in waiting:
            blocked.setdefault(row.kind, []).append(row.target)
        for row in waiting[:NAMED]:
            self.list_target(row)
        if waiting:
            more = f" ({len(waiting) - NAMED} more not listed)" if len(waiting) > NAMED else ""
            self.stdout.write(
                f"{len(waiting)} target(s) held, open or half-open{more}: "
                "their intents wait on purpose, not counted as stuck"
            )
        pending = backlog.states[State.PENDING]
        waits = {
            k.kind: now - k.oldest_due
            for k in backlog.kinds
            if k.oldest_due is not None and not k.paused
        }
        for kind in [k for k in waits if k in blocked and waits[k].total_seconds() > max_age]:
            since = self.oldest_unblocked(kind, blocked[kind], now, using)
            if since is None:
                del waits[kind]
            else:
                waits[kind] = now - since
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

    def list_target(self, row: TargetRow) -> None:
        until = "" if row.until is None else f" until {row.until.isoformat()}"
        target = Truncator(row.target).chars(TARGET_SHOWN)
        self.stdout.write(f"target {row.kind!r} -> {target!r}: {row.state}{until}")

    def oldest_unblocked(
        self, kind: str, targets: list[str], now: datetime, using: str
    ) -> datetime | None:
        """When the longest-waiting due intent of ``kind`` outside ``targets`` became due."""
        due = Intent.objects.using(using).filter(states.due(now), kind=kind)
        found: datetime | None = due.exclude(target__in=targets).aggregate(
            since=Min(states.due_since())
        )["since"]
        return found

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

    def check_running(self, backlog: Backlog, max_running: float, using: str) -> None:
        """Fail naming the intents (the first ``NAMED``) and kinds whose attempt has run
        longer than ``max_running`` seconds; else say how long the longest has."""
        runs = {
            k.kind: (backlog.now - k.oldest_running).total_seconds()
            for k in backlog.kinds
            if k.oldest_running is not None
        }
        if not runs:
            self.stdout.write(f"ok: nothing is running (max running {max_running:g}s)")
            return
        kind = max(runs, key=runs.__getitem__)
        if runs[kind] <= max_running:
            self.stdout.write(
                f"ok: the longest attempt (kind {kind!r}) has run {runs[kind]:.0f}s "
                f"(max running {max_running:g}s)"
            )
            return
        # Running intents hold a worker's slot each: few, whatever the table holds.
        late = (
            Intent.objects.using(using)
            .filter(state=State.RUNNING, next_at__lt=backlog.now - timedelta(seconds=max_running))
            .order_by("next_at", "id")
        )
        per_kind = Counter(late.values_list("kind", flat=True))
        kinds = ", ".join(f"{k!r} ({n})" for k, n in sorted(per_kind.items()))
        named = ", ".join(
            f"{id} ({k!r}, {(backlog.now - since).total_seconds():.0f}s)"
            for id, k, since in late.values_list("id", "kind", "next_at")[:NAMED]
        )
        more = per_kind.total() - min(per_kind.total(), NAMED)
        raise CommandError(
            f"running too long: {per_kind.total()} attempt(s) have run more than --max-running "
            f"{max_running:g}s since their intent became due, of kind(s) {kinds}: {named}"
            + (f" and {more} more" if more else "")
            + ". Is a handler hung? Retry now or Cancel them in the admin once you know why.",
            returncode=1,
        )
