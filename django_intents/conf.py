"""The ``INTENTS`` setting, validated once and cached until settings change.

Everything else in the app reads configuration through :func:`get_settings`,
so a typo is reported in one place (as a system check) instead of surfacing as
an ``AttributeError`` deep inside a worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_intents.rules.cron import Schedule
from django_intents.rules.cron import parse as parse_schedules
from django_intents.rules.identity import check_text
from django_intents.rules.limits import Limit
from django_intents.rules.limits import parse as parse_limits
from django_intents.rules.states import TERMINAL
from django_intents.rules.targets import TargetPolicy


@dataclass(frozen=True)
class Retention:
    """How long a terminal intent keeps its payload (``compact``) and its row (``delete``)."""

    compact: timedelta | None = None
    delete: timedelta | None = None


@dataclass(frozen=True)
class IntentSettings:
    handlers: Mapping[str, str] = field(default_factory=dict)
    external_kinds: frozenset[str] = frozenset()
    workers: int = 4
    concurrency: int = 100
    lease: float = 30.0
    renew: float | None = None
    poll_interval: float = 0.1
    max_attempts: int | None = None
    # None: the kinds the project declares (handlers.metric_kinds), known only
    # once the handlers are registered, so they are not resolved here.
    metric_kinds: tuple[str, ...] | None = None
    retention: Mapping[str, Retention] | None = None
    gauge_cache: float = 5.0
    db_error_timeout: float = 60.0
    limits: Mapping[str, Limit] = field(default_factory=dict)  # LIMITS' caps: the claims'
    timeouts: Mapping[str, float] = field(default_factory=dict)  # LIMITS' timeouts: the pool's
    # LIMITS' rate, breaker and ordered: how each target of a kind is treated (SPEC §14)
    targets: Mapping[str, TargetPolicy] = field(default_factory=dict)
    schedules: Mapping[str, Schedule] = field(default_factory=dict)
    # LISTEN_DATABASE: one alias, or (several queue databases) queue alias -> alias.
    listen_database: str | Mapping[str, str] | None = None
    # The aliases the queue lives on (issue 41); None: the one the router picks.
    databases: tuple[str, ...] | None = None
    # The replica each queue database's admin counts and gauges read (READ_DATABASE).
    read_databases: Mapping[str, str] = field(default_factory=dict)

    def listen_alias(self, alias: str) -> str:
        """The alias whose connection LISTENs for the pool of ``alias``: ``LISTEN_DATABASE``
        (one alias, or ``alias``'s entry of a dict), else ``alias`` itself."""
        listen = self.listen_database
        if isinstance(listen, Mapping):
            return listen.get(alias, alias)
        return listen or alias

    def read_alias(self, alias: str) -> str:
        """The database the admin's counts and the gauges of ``alias`` read: its replica
        (``READ_DATABASE``, issue 41), else ``alias`` itself."""
        return self.read_databases.get(alias) or self.read_databases.get("") or alias

    @property
    def renew_interval(self) -> float:
        return self.renew if self.renew is not None else self.lease / 3


class SettingError(ValueError):
    """One problem with one key; ``check_id`` is the stable system check id."""

    def __init__(self, key: str, message: str, check_id: str = "django_intents.E001") -> None:
        super().__init__(f"INTENTS[{key!r}] {message}")
        self.key = key
        self.check_id = check_id


def _positive_number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise SettingError(key, f"must be a positive number of seconds, not {value!r}")
    return float(value)


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(key, f"must be a positive integer, not {value!r}")
    return value


def _handlers(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise SettingError(key, f"must be a dict of kind -> dotted path, not {value!r}")
    for kind, path in value.items():
        if not isinstance(kind, str) or not kind or not isinstance(path, str) or "." not in path:
            raise SettingError(key, f"entry {kind!r}: {path!r} is not kind -> 'module.function'")
    return dict(value)


def _external_kinds(key: str, value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise SettingError(key, f"must be a list of kind names, not {value!r}")
    for kind in value:
        try:
            check_text("kind", kind)
        except ValueError as exc:
            raise SettingError(key, f"entry {kind!r}: {exc}") from None
    return frozenset(value)


def _renew(key: str, value: Any) -> float | None:
    return None if value is None else _positive_number(key, value)


def _max_attempts(key: str, value: Any) -> int | None:
    return None if value is None else _positive_int(key, value)


def _metric_kinds(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise SettingError(key, f"must be a sequence of kind names, not {value!r}")
    if not all(isinstance(kind, str) and kind for kind in value):
        raise SettingError(key, f"must contain only non-empty strings, not {value!r}")
    return tuple(value)


def _window(key: str, state: str, name: str, value: Any) -> timedelta | None:
    if value is None or isinstance(value, timedelta) and value >= timedelta(0):
        return value
    raise SettingError(key, f"[{state!r}][{name!r}] must be a timedelta >= 0 or None")


def _retention(key: str, value: Any) -> dict[str, Retention] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SettingError(key, f"must be None or a dict keyed by terminal state, not {value!r}")
    result = {}
    for state, windows in value.items():
        if state not in TERMINAL:
            pruned = tuple(str(terminal) for terminal in TERMINAL)
            raise SettingError(key, f"has state {state!r}; only {pruned} are pruned")
        if not isinstance(windows, Mapping) or set(windows) - {"compact", "delete"}:
            raise SettingError(key, f"[{state!r}] must be a dict with 'compact' and/or 'delete'")
        compact = _window(key, state, "compact", windows.get("compact"))
        delete = _window(key, state, "delete", windows.get("delete"))
        if compact is not None and delete is not None and delete < compact:
            raise SettingError(key, f"[{state!r}] deletes before it compacts")
        result[state] = Retention(compact=compact, delete=delete)
    return result


def _alias(key: str, value: Any) -> str | None:
    if value is None:
        return None
    aliases = getattr(django_settings, "DATABASES", {})
    if not isinstance(value, str) or value not in aliases:
        known = ", ".join(repr(alias) for alias in aliases)
        raise SettingError(key, f"must be a database alias ({known}), not {value!r}")
    return value


def _listen(key: str, value: Any) -> str | dict[str, str] | None:
    """``LISTEN_DATABASE``: an alias, or a dict of queue alias -> the alias to LISTEN on
    for it (several queue databases behind PgBouncer, issue 41)."""
    if not isinstance(value, Mapping):
        return _alias(key, value)
    for queue, direct in value.items():
        _alias(key, queue)
        _alias(key, direct)
    return dict(value)


def _databases(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise SettingError(key, f"must be a list of database aliases, not {value!r}")
    if not value:
        raise SettingError(key, "must list at least one database alias (or be None)")
    for alias in value:
        if not isinstance(alias, str):
            raise SettingError(key, f"entry {alias!r} is not a database alias")
        _alias(key, alias)
    twice = sorted({alias for alias in value if value.count(alias) > 1})
    if twice:
        raise SettingError(key, f"lists {', '.join(map(repr, twice))} more than once")
    return tuple(value)


def _read_databases(key: str, value: Any) -> dict[str, str]:
    """``READ_DATABASE``: one alias (the replica of the queue's one database), or a dict
    of queue alias -> replica alias; checked against ``DATABASES`` in ``parse``."""
    if value is None:
        return {}
    if isinstance(value, str):
        _alias(key, value)
        return {"": value}
    if not isinstance(value, Mapping) or not value:
        raise SettingError(
            key, f"must be a database alias or a dict of alias -> alias, not {value!r}"
        )
    for queue, replica in value.items():
        _alias(key, queue)
        _alias(key, replica)
    return dict(value)


def _limits(
    key: str, value: Any
) -> tuple[dict[str, Limit], dict[str, float], dict[str, TargetPolicy]]:
    try:
        return parse_limits(value)
    except ValueError as exc:
        raise SettingError(key, str(exc)) from None


def _schedules(key: str, value: Any) -> dict[str, Schedule]:
    try:
        return parse_schedules(value)
    except ValueError as exc:
        raise SettingError(key, str(exc)) from None


_PARSERS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "HANDLERS": ("handlers", _handlers),
    "EXTERNAL_KINDS": ("external_kinds", _external_kinds),
    "WORKERS": ("workers", _positive_int),
    "CONCURRENCY": ("concurrency", _positive_int),
    "LEASE": ("lease", _positive_number),
    "RENEW": ("renew", _renew),
    "POLL_INTERVAL": ("poll_interval", _positive_number),
    "MAX_ATTEMPTS": ("max_attempts", _max_attempts),
    "METRIC_KINDS": ("metric_kinds", _metric_kinds),
    "RETENTION": ("retention", _retention),
    "GAUGE_CACHE": ("gauge_cache", _positive_number),
    "DB_ERROR_TIMEOUT": ("db_error_timeout", _positive_number),
    "LIMITS": ("limits", _limits),
    "SCHEDULES": ("schedules", _schedules),
    "LISTEN_DATABASE": ("listen_database", _listen),
    "DATABASES": ("databases", _databases),
    "READ_DATABASE": ("read_databases", _read_databases),
}


def parse(raw: Any) -> tuple[IntentSettings, list[SettingError]]:
    """Return the settings built from ``raw`` and every problem found on the way."""
    if raw is None:
        return IntentSettings(), []
    if not isinstance(raw, Mapping):
        return IntentSettings(), [SettingError("INTENTS", "must be a dict", "django_intents.E003")]
    values: dict[str, Any] = {}
    errors = []
    for key, value in raw.items():
        if key not in _PARSERS:
            known = ", ".join(_PARSERS)
            errors.append(SettingError(key, f"is not a known key ({known})", "django_intents.E002"))
            continue
        attr, parser = _PARSERS[key]
        try:
            values[attr] = parser(key, value)
        except SettingError as exc:
            errors.append(exc)
    if "limits" in values:  # one key, three settings: the claims' caps, the pool's timeouts,
        # and how each target of a kind is treated (SPEC §14)
        values["limits"], values["timeouts"], values["targets"] = values["limits"]
    built = IntentSettings(**values)
    several = built.databases is not None and len(built.databases) > 1
    if "" in built.read_databases and several:
        errors.append(
            SettingError(
                "READ_DATABASE",
                "names one replica, but DATABASES lists several: map each queue database "
                "to its replica, {alias: replica}",
            )
        )
    strays = sorted(set(built.read_databases) - {"", *(built.databases or ())})
    if strays and built.databases is not None:
        errors.append(
            SettingError("READ_DATABASE", f"maps {', '.join(map(repr, strays))}, not in DATABASES")
        )
    if not errors and built.renew is not None and built.renew >= built.lease:
        errors.append(SettingError("RENEW", f"({built.renew}) must be shorter than LEASE"))
    return built, errors


@functools.cache
def get_settings() -> IntentSettings:
    """Return the validated settings; raise ``ImproperlyConfigured`` naming the bad key."""
    built, errors = parse(getattr(django_settings, "INTENTS", None))
    if errors:
        raise ImproperlyConfigured("; ".join(str(error) for error in errors))
    return built


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "INTENTS":
        get_settings.cache_clear()
