"""``manage.py run_intent_workers``: a thin adapter from options to a :class:`WorkerPool`.

Everything a user can get wrong on the command line is refused here, before a
single intent is claimed: bad numbers by the ``type=`` functions of
``options``, a kind without a handler and a kind registered twice by
``handle()``, and a database that was never migrated by ``schema.require_table``.

A pool that runs to an end (``--drain``, ``--until-empty``) shows its
progress against the backlog it started with (a bar on a terminal, a plain
log line every 10 s elsewhere) and ends by printing its outcomes per kind and
its rate on stdout: the table a cron job's mail or a CI log shows.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DatabaseFailure
from tqdm.contrib.logging import logging_redirect_tqdm  # type: ignore[import-untyped]

from django_intents.conf import get_settings
from django_intents.handlers import discover
from django_intents.management.options import (
    add_databases,
    chosen_databases,
    grace_seconds,
    kind_list,
    port,
    positive_int,
    positive_seconds,
)
from django_intents.management.progress import Progress, raw
from django_intents.management.schema import require_table
from django_intents.models import Intent
from django_intents.observability import metrics
from django_intents.observability.gauges import QUEUE
from django_intents.rules import states
from django_intents.store.clock import server_now
from django_intents.worker import log
from django_intents.worker.fleet import Fleet
from django_intents.worker.pool import WorkerPool


class Command(BaseCommand):
    help = "Run a pool of workers that claim due intents and run their handlers."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--workers",
            type=positive_int,
            metavar="N",
            help="sync handlers run at once (threads); default INTENTS['WORKERS']",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            metavar="N",
            help="async handlers awaited at once; default INTENTS['CONCURRENCY'] (100)",
        )
        parser.add_argument(
            "--kinds",
            type=kind_list,
            metavar="A,B",
            help="only claim these kinds (default: every kind with a handler)",
        )
        parser.add_argument(
            "--lease",
            type=positive_seconds,
            metavar="SECONDS",
            help="lease of each claim; default INTENTS['LEASE']",
        )
        parser.add_argument(
            "--renew",
            type=positive_seconds,
            metavar="SECONDS",
            help="renewal period, shorter than the lease; default lease / 3",
        )
        parser.add_argument(
            "--drain",
            action="store_true",
            help="exit 0 once a claim finds no intent of the pool's kinds due and every "
            "attempt the pool started has finished; intents not due yet (retries backing "
            "off, next_at in the future) are left pending: see --until-empty",
        )
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="exit 0 once no intent of the pool's kinds is pending or running, "
            "scheduled retries included: keep polling until they have run (for CI; "
            "bound it with --timeout)",
        )
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            metavar="SECONDS",
            help="with --drain or --until-empty: if not done after this long, stop as on "
            "SIGTERM (--grace applies) and exit 1, naming how many intents are left",
        )
        parser.add_argument(
            "--timeout-per-attempt",
            type=positive_seconds,
            metavar="SECONDS",
            help="cancel an attempt running longer than this, and retry it as a failure, "
            "for kinds without LIMITS[kind]['timeout'] (default: no timeout)",
        )
        parser.add_argument(
            "--grace",
            type=grace_seconds,
            default=10.0,
            metavar="SECONDS",
            help="on SIGTERM/SIGINT, how long running handlers may finish; past a timeout, "
            "how long a sync handler may take to return before its intent is retried "
            "without it (default 10)",
        )
        parser.add_argument(
            "--db-error-timeout",
            type=positive_seconds,
            metavar="SECONDS",
            help="exit non-zero after database errors for this long; "
            "default INTENTS['DB_ERROR_TIMEOUT']",
        )
        parser.add_argument(
            "--summary-interval",
            type=positive_seconds,
            default=60.0,
            metavar="SECONDS",
            help="log a one-line summary of the outcomes this often (default 60); "
            "the pool also logs one when it stops",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            metavar="PORT",
            help="serve Prometheus /metrics and /healthz on this port",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDRESS",
            help="address for --metrics-port (default 127.0.0.1)",
        )
        add_databases(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        _configure_logging(options["verbosity"])
        aliases = chosen_databases(options["database"], options["all_databases"])
        try:
            settings = get_settings()
            handlers = discover()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        if options["kinds"] is not None:
            missing = sorted(set(options["kinds"]) - set(handlers))
            if missing:
                known = ", ".join(sorted(handlers)) or "none"
                raise CommandError(f"no handler for kind(s) {', '.join(missing)} (known: {known})")
            handlers = {kind: handlers[kind] for kind in options["kinds"]}
        if not handlers:
            raise CommandError(
                "no handlers: register some with @django_intents.handler(kind) in an app's "
                "handlers.py, or in INTENTS['HANDLERS']"
            )
        lease = options["lease"] if options["lease"] is not None else settings.lease
        renew = options["renew"]
        if renew is None:
            renew = settings.renew_interval if options["lease"] is None else lease / 3
        if renew >= lease:
            raise CommandError(
                f"--renew ({renew:g} s) must be shorter than the lease ({lease:g} s)"
            )
        if options["timeout"] is not None and not (options["drain"] or options["until_empty"]):
            raise CommandError(
                "--timeout bounds --drain or --until-empty; without either the pool runs "
                "until it is stopped"
            )
        several = len(aliases) > 1
        if several and isinstance(settings.listen_database, str):
            raise CommandError(
                "INTENTS['LISTEN_DATABASE'] names one database to LISTEN on; a process that "
                "serves several databases listens on each of them: make it a dict of queue "
                "alias -> the alias to LISTEN on for it"
            )
        # A database error here is an outage, not a set-up step: the pool rides
        # it out for --db-error-timeout like any other.
        for alias in aliases:
            with contextlib.suppress(DatabaseFailure):
                require_table(alias)

        pools = {
            alias: WorkerPool(
                handlers=handlers,
                workers=options["workers"],
                concurrency=options["concurrency"],
                lease=lease,
                renew=renew,
                grace=options["grace"],
                drain=options["drain"],
                until_empty=options["until_empty"],
                timeout=options["timeout"],
                timeout_per_attempt=options["timeout_per_attempt"],
                db_error_timeout=options["db_error_timeout"],
                report_interval=options["summary_interval"],
                using=alias,
                handle_signals=not several,
            )
            for alias in aliases
        }
        ends = options["drain"] or options["until_empty"]
        runner: WorkerPool | Fleet = Fleet(pools, drain=ends) if several else pools[aliases[0]]
        server = None
        if options["metrics_port"] is not None:
            QUEUE.read_from(*aliases)
            server = self._serve_metrics(options["metrics_addr"], options["metrics_port"], runner)
        try:
            if ends:
                kinds, due = list(handlers), not options["until_empty"]
                with self._progress(pools, kinds, due=due):
                    status = runner.run()
            else:
                status = runner.run()
        finally:
            close = getattr(server, "close", None)
            if close is not None:
                close()
        if ends:
            for alias, pool in pools.items():
                if several:
                    self.stdout.write(f"database {alias}:")
                self.stdout.write(pool.outcomes.table())
        if status:
            sys.exit(status)

    @contextlib.contextmanager
    def _progress(
        self, pools: dict[str, WorkerPool], kinds: list[str], *, due: bool
    ) -> Iterator[None]:
        """Show a drain's progress against the backlog counted now, on every database:
        due intents for ``--drain``, pending and running ones for ``--until-empty``."""
        total: int | None = 0
        for using in pools:
            try:
                rows = Intent.objects.using(using).filter(kind__in=kinds)
                active = rows.filter(states.due(server_now(using))) if due else rows.pending()
                counted = active.order_by().count()
            except DatabaseFailure:
                total = None  # the pool meets the outage and says so; a bar needs no total
                break
            total = (total or 0) + counted
        progress = Progress(
            description="draining" if due else "running until empty",
            unit="intents",
            stream=raw(self.stdout),
            total=total,
            write=log.info,
        )
        for pool in pools.values():
            pool.outcomes.watch(progress.advance)
        try:
            if progress.tty:
                # Log lines printed above the bar rather than through it.
                with logging_redirect_tqdm(loggers=[logging.getLogger("django_intents")]):
                    yield
            else:
                yield
        finally:
            progress.close()

    def _serve_metrics(self, addr: str, port: int, pool: WorkerPool | Fleet) -> object:
        try:
            server = metrics.serve(addr, port, pool.healthy)
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        log.info("serving /metrics and /healthz on %s:%s", addr, getattr(server, "port", port))
        return server


def _configure_logging(verbosity: int) -> None:
    """Make the pool's log lines visible unless ``LOGGING`` already routes them."""
    logger = logging.getLogger("django_intents")
    if logger.level == logging.NOTSET:
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
