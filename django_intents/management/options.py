"""The ``--database`` option every command of the app takes (SPEC §12)."""

from __future__ import annotations

import argparse

from django.core.management.base import CommandError
from django.db import connections, router

from django_intents.models import Intent


def add_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help="the database alias of the queue (default: the router's choice for Intent)",
    )


def chosen_database(alias: str | None) -> str:
    """``--database``, checked before anything is read or written; else the router's choice."""
    if alias is None:
        return router.db_for_write(Intent)
    if alias not in connections:
        known = ", ".join(repr(a) for a in connections)
        raise CommandError(f"unknown database alias {alias!r} (DATABASES has {known})")
    return alias
