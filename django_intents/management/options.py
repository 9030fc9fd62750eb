"""What the app's commands take on their command lines, checked before anything runs.

``--database`` (SPEC §12), which every command takes, and the ``type=``
functions of the other options: a bad value is refused by ``argparse`` with
a message naming it, before a database is touched.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from django.core.management.base import CommandError
from django.db import connections, router
from django.utils import timezone

from django_intents.conf import get_settings
from django_intents.models import Intent
from django_intents.rules.identity import check_text

_N = TypeVar("_N", int, float)


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


def add_databases(parser: argparse.ArgumentParser) -> None:
    """``--database``, which may be given more than once, and ``--all-databases`` (issue 41)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--database",
        metavar="ALIAS",
        action="append",
        help="a database alias of the queue; repeat it to serve several from one process "
        "(default: the router's choice for Intent)",
    )
    group.add_argument(
        "--all-databases",
        action="store_true",
        help="every database of INTENTS['DATABASES']",
    )


def chosen_databases(aliases: list[str] | None, every: bool) -> list[str]:
    """``--database`` (each checked, in order, once) or ``--all-databases``; else the
    router's choice."""
    if every:
        listed = get_settings().databases
        if listed is None:
            raise CommandError(
                "--all-databases serves INTENTS['DATABASES'], which is not set: list the "
                "queue's database aliases there, or name them with --database"
            )
        return list(listed)
    if not aliases:
        return [chosen_database(None)]
    return list(dict.fromkeys(chosen_database(alias) for alias in aliases))


def positive_int(value: str) -> int:
    parsed = _parse(int, value, "a whole number")
    if parsed < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {parsed}")
    return parsed


def seconds(value: str, *, allow_zero: bool = False, allow_infinite: bool = False) -> float:
    """``value`` as seconds: more than 0 (or at least 0), and finite unless told otherwise."""
    parsed = _parse(float, value, "a number of seconds")
    in_range = parsed >= 0 if allow_zero else parsed > 0  # False for NaN
    if not in_range or (math.isinf(parsed) and not allow_infinite):
        limit = ">= 0" if allow_zero else "> 0"
        raise argparse.ArgumentTypeError(f"must be a number of seconds {limit}, not {value!r}")
    return parsed


def positive_seconds(value: str) -> float:
    return seconds(value)


def grace_seconds(value: str) -> float:
    return seconds(value, allow_zero=True)


def age_seconds(value: str) -> float:
    """A longest acceptable wait: 0 or more, ``inf`` for none."""
    return seconds(value, allow_zero=True, allow_infinite=True)


def kind_list(value: str) -> list[str]:
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    if not kinds:
        raise argparse.ArgumentTypeError("expected a comma-separated list of kinds")
    try:
        return [check_text("kind", kind) for kind in kinds]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def text_of(name: str) -> Callable[[str], str]:
    """The ``type=`` of an option that is a kind or a target, checked as enqueue checks it."""

    def check(value: str) -> str:
        try:
            return check_text(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def instant(value: str) -> datetime:
    """An ISO 8601 date or time; one without an offset is in the current time zone
    (``TIME_ZONE``), as Django reads a naive time from a form."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 date or time (e.g. 2026-12-05T10:00:00+00:00)"
        ) from None
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


def port(value: str) -> int:
    parsed = _parse(int, value, "a port number")
    if not 0 <= parsed <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, not {parsed}")
    return parsed


def _parse(convert: Callable[[str], _N], value: str, what: str) -> _N:
    """``convert(value)``, or the error ``argparse`` shows as "'x' is not <what>"."""
    try:
        return convert(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
