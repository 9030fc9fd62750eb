"""Settings of the example shop.

SQLite by default, in WAL mode with immediate transactions: the web process and
the worker pool write to the same file, and SQLite allows one writer at a time,
so writers must queue for the lock instead of failing with "database is locked".
``DATABASE_URL`` (``postgres://user:password@host:5432/name`` or
``mysql://user:password@host:3306/name``) switches to PostgreSQL or MariaDB/MySQL.
``EXAMPLE_DATA_DIR`` says where the SQLite file lives (``run.py --dir`` sets it).
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import django
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent
ROOT_DIR = BASE_DIR.parent
DATA_DIR = Path(os.environ.get("EXAMPLE_DATA_DIR") or ROOT_DIR / ".tmp" / "example")

ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
    "sqlite": "django.db.backends.sqlite3",
}

SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def sqlite_database(path: Path | str) -> dict[str, Any]:
    """A file database every process of the example shares (never ``:memory:``)."""
    return {"ENGINE": ENGINES["sqlite"], "NAME": str(path), "OPTIONS": dict(SQLITE_OPTIONS)}


def database_from_url(url: str) -> dict[str, Any]:
    """Turn ``scheme://user:password@host:port/name?option=value`` into a ``DATABASES`` entry.

    Parsed with :mod:`urllib.parse` so that the example needs no dependency of its
    own; user and password may be percent-encoded, query parameters become
    ``OPTIONS``. ``sqlite:///absolute/path.sqlite3`` is accepted too.
    """
    parts = urlsplit(url)
    engine = ENGINES.get(parts.scheme)
    if engine is None:
        known = ", ".join(sorted(ENGINES))
        raise ValueError(f"DATABASE_URL scheme {parts.scheme!r} is not one of {known}")
    name = unquote(parts.path.removeprefix("/"))
    if engine == ENGINES["sqlite"]:
        if not name:
            raise ValueError("DATABASE_URL for SQLite needs a path: sqlite:///path/to/db.sqlite3")
        return sqlite_database(name)  # sqlite:////abs/path keeps its leading slash
    if not name:
        raise ValueError(f"DATABASE_URL {parts.scheme}://... needs a database name")
    options: dict[str, Any] = dict(parse_qsl(parts.query))
    database: dict[str, Any] = {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }
    if engine == ENGINES["mysql"]:
        # 4-byte UTF-8 and a binary collation: intent ids and event ids compare exactly.
        options.setdefault("charset", "utf8mb4")
        database["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"}
    return database


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {"default": sqlite_database(DATA_DIR / "example.sqlite3")}

# A demo: the key is public and DEBUG is on so that runserver serves the admin's
# CSS. Never deploy these two lines.
SECRET_KEY = os.environ.get("EXAMPLE_SECRET_KEY", "django-intents-example-not-secret")
DEBUG = os.environ.get("EXAMPLE_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "django_intents",
    "example_project.shop",
]
if find_spec("django.tasks") is None:
    # Django 5.2: django.tasks comes from the django-tasks backport, an app
    # (run.py installs it with the "tasks" extra). Django 6 has it built in.
    # The shop's order view enqueues a @task, so it cannot run without one.
    if find_spec("django_tasks") is None:
        raise ImproperlyConfigured(
            f"The example shop enqueues a @task, and Django {django.get_version()} has no "
            "django.tasks: install the django-tasks backport with "
            "`pip install -e '.[tasks]'` (from the checkout), or use Django 6. "
            "`python3 example_project/run.py` does this for you."
        )
    INSTALLED_APPS.insert(INSTALLED_APPS.index("django_intents"), "django_tasks")
MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# Short enough that the demo ends: a lease lost to a killed worker comes back
# within seconds, and an intent that keeps failing is cancelled after its fourth
# attempt (backoff 2 s, 4 s, 8 s) instead of retrying for ever.
INTENTS = {
    "LEASE": 10,
    "MAX_ATTEMPTS": 4,
    "WORKERS": 4,
    "POLL_INTERVAL": 0.2,
    # At most 2 deliveries to one partner URL in flight, 4 webhooks in all,
    # across every worker pool: switch the partner page to "hang" and watch
    # the rest of the queue keep moving while 2 wait on the hung partner.
    "LIMITS": {"webhook": {"running": 4, "per_target": 2}},
    # A handler named by dotted path, beside the @handler ones of shop/handlers.py.
    "HANDLERS": {"digest": "example_project.shop.digest.daily_digest"},
    # Every morning at 06:00 shop time, yesterday's orders are summed up in the
    # log, once, however many worker pools run: the slot's id is the same in
    # each. The admin's intents list shows the last and next slot.
    "SCHEDULES": {
        "daily-digest": {
            "cron": "0 6 * * *",
            "tz": "Europe/Paris",
            "kind": "digest",
            "target": "ops@shop.example",
            "payload": {"tz": "Europe/Paris"},
        },
    },
}

# @task functions (shop/tasks.py) are stored as intents of kind "django.tasks"
# and run by the same run_intent_workers pool, with the INTENTS settings above.
TASKS = {"default": {"BACKEND": "django_intents.tasks.IntentsBackend"}}

# Where orders placed on the site send their "order.placed" webhook. Empty means
# the shop's own receiver (/webhooks/receive/), which plays the partner.
SHOP_PARTNER_URL = os.environ.get("SHOP_PARTNER_URL", "")
# The fraction of deliveries the receiver refuses with 503 when a request does not
# say (?fail=0.3 does); decided per idempotency key and attempt, so runs repeat.
SHOP_RECEIVER_FAIL = float(os.environ.get("SHOP_RECEIVER_FAIL", "0"))
# How long the receiver hangs when the partner page says "hang" before it answers
# 503: one second past the webhook handler's 5 s client timeout (TIMEOUT in
# shop/handlers.py), so the handler gives up first, and a runserver thread is
# not held for ever.
SHOP_PARTNER_HANG = float(os.environ.get("SHOP_PARTNER_HANG", "6"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"not_receiver": {"()": "example_project.shop.logs.NotReceiver"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_intents": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "example_project": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # The receiver refuses deliveries on purpose and logs each refusal itself;
        # Django's own lines about those responses would only look like errors.
        "django.request": {"filters": ["not_receiver"]},
        # Access lines at WARNING and above only: 4xx and 5xx, not every poll.
        "django.server": {
            "handlers": ["console"],
            "level": "WARNING",
            "propagate": False,
            "filters": ["not_receiver"],
        },
    },
}
