"""Test settings: the database comes from INTENTS_TEST_DB (sqlite, postgresql, pgbouncer, mysql).

``pgbouncer`` is PostgreSQL through PgBouncer in transaction mode (started by
``tests/pgbouncer/start``), with LISTEN on a direct connection.

SQLite is a file, not ``:memory:``, so worker subprocesses and threads share it.
INTENTS_TEST_DB_SUFFIX keeps parallel runs on one machine out of each other's way.
"""

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import django

BASE_DIR = Path(__file__).resolve().parent.parent
VENDOR = os.environ.get("INTENTS_TEST_DB", "sqlite")
SUFFIX = os.environ.get("INTENTS_TEST_DB_SUFFIX", "")
TEST_NAME = f"test_django_intents{SUFFIX}"
SHARD = os.environ.get("INTENTS_TEST_SHARD", "")
DATABASES: dict[str, dict[str, Any]]  # one alias per vendor below, with OPTIONS of its own


def database(vendor: str, test_name: str) -> dict[str, Any]:
    """The settings of one database alias of ``vendor``, tested as ``test_name``."""
    if vendor == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(BASE_DIR / ".tmp" / f"intents{SUFFIX}.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": str(BASE_DIR / ".tmp" / f"{test_name}.sqlite3")},
        }
    if vendor in ("postgresql", "pgbouncer"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": test_name},
        }
    if vendor == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": "test",
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": test_name, "CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"},
        }
    raise RuntimeError(
        f"INTENTS_TEST_DB must be sqlite, postgresql, pgbouncer or mysql, not {vendor!r}"
    )


DATABASES = {"default": database(VENDOR, TEST_NAME)}
if VENDOR == "pgbouncer":
    # Everything goes through PgBouncer in transaction mode (tests/pgbouncer/start)
    # but LISTEN, which needs a session: "direct" is the same database, unpooled.
    DATABASES["direct"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
    DATABASES["default"] = {
        **DATABASES["default"],
        "HOST": os.environ.get("PGBOUNCER_HOST", "127.0.0.1"),
        "PORT": os.environ.get("PGBOUNCER_PORT", "6432"),
        "DISABLE_SERVER_SIDE_CURSORS": True,
    }
if SHARD:
    # A second database for the tests of several (tests/test_shards.py, issue 41):
    # its own test database, of the same vendor or another.
    DATABASES["shard"] = database(SHARD, f"{TEST_NAME}_shard")
    if SHARD == "sqlite":
        DATABASES["shard"]["NAME"] = str(BASE_DIR / ".tmp" / f"intents{SUFFIX}_shard.sqlite3")
    # A "replica" of the first: the same test database (INTENTS["READ_DATABASE"]).
    DATABASES["replica"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}

(BASE_DIR / ".tmp").mkdir(exist_ok=True)

SECRET_KEY = "django-intents-tests"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_intents",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
# Admin tests log users in; the default hasher would make each one cost ~0.3 s.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The kinds the manager, admin and metrics tests enqueue as plain labels. Nothing
# in this project runs them, so enqueue would refuse them as typos; the suite
# declares them the way a project declares kinds another service runs. Tests
# that hand a pool its handlers directly declare their own kinds with
# tests.conftest.external_kinds.
EXTERNAL_KINDS = ["webhook", "job", "push", "delivery", "replication"]
INTENTS = {"LEASE": 30, "EXTERNAL_KINDS": EXTERNAL_KINDS}
if VENDOR == "pgbouncer":
    INTENTS["LISTEN_DATABASE"] = "direct"
# Django 6 has django.tasks built in; on 5.2 the django-tasks backport (a dev
# dependency) is an app. Without it the rest of the suite still runs, and the
# tests/test_tasks_*.py modules fail to import, loudly.
if django.VERSION >= (6, 0) or find_spec("django_tasks"):
    if django.VERSION < (6, 0):
        INSTALLED_APPS.append("django_tasks")
    TASKS = {
        "default": {
            "BACKEND": "django_intents.tasks.IntentsBackend",
            "QUEUES": ["default", "emails"],
        },
    }
