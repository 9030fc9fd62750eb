"""Settings for the benchmark: one system on one database, chosen by the environment.

``BENCH_DB`` is ``sqlite``, ``postgresql`` or ``mysql``; ``BENCH_SYSTEM`` is
``intents`` or one of the peers (``tasks_db``, ``ox``, ``procrastinate``).
Each system gets its own database (``bench_<system>``; ``BENCH_DB_PREFIX``
replaces ``bench``), so a run never touches
the test databases and one system's dead rows never slow another down. Every
system runs with persistent connections (``CONN_MAX_AGE = None``), the
setting each one documents for throughput.
"""

import json
import os
from pathlib import Path

from bench.databases import database

BENCH_DIR = Path(__file__).resolve().parent
VENDOR = os.environ.get("BENCH_DB", "sqlite")
SYSTEM = os.environ.get("BENCH_SYSTEM", "intents")
# Runs from two checkouts on one server must not empty each other's tables.
NAME = f"{os.environ.get('BENCH_DB_PREFIX', 'bench')}_{SYSTEM}"
WORK = Path(os.environ.get("BENCH_WORK", BENCH_DIR.parent / ".tmp" / "bench"))
WORK.mkdir(parents=True, exist_ok=True)

DATABASES = {"default": database(VENDOR, NAME, WORK, variable="BENCH_DB")}
DATABASES["default"]["CONN_MAX_AGE"] = None
if os.environ.get("BENCH_SSB"):
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True
if os.environ.get("BENCH_PREPARE") and VENDOR == "postgresql":
    # psycopg's prepared statements: parsed and planned once per connection
    # (no transaction-mode pooler in front); the value is prepare_threshold.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = int(
        os.environ["BENCH_PREPARE"]
    )

SECRET_KEY = "django-intents-bench"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "bench.benchapp.apps.BenchConfig"]
LOGGING_CONFIG = None

if SYSTEM == "intents":
    INSTALLED_APPS.append("django_intents")
    INTENTS: dict[str, object] = {}
    if os.environ.get("BENCH_MAX_ATTEMPTS"):  # the io workload's failing variants
        INTENTS["MAX_ATTEMPTS"] = int(os.environ["BENCH_MAX_ATTEMPTS"])
    if os.environ.get("BENCH_LIMITS"):  # INTENTS["LIMITS"] as JSON: relay, and what limits cost
        INTENTS["LIMITS"] = json.loads(os.environ["BENCH_LIMITS"])
    if os.environ.get("BENCH_DELETE_DAYS"):  # bench/history.py's prune: completed, deleted
        from datetime import timedelta

        days = timedelta(days=float(os.environ["BENCH_DELETE_DAYS"]))
        INTENTS["RETENTION"] = {"completed": {"delete": days}}
elif SYSTEM == "tasks_db":
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
elif SYSTEM == "ox":
    INSTALLED_APPS.append("django_ox")
    TASKS = {"default": {"BACKEND": "django_ox.backend.OxBackend"}}
elif SYSTEM == "procrastinate":
    INSTALLED_APPS.append("procrastinate.contrib.django")
else:
    raise RuntimeError(f"unknown BENCH_SYSTEM {SYSTEM!r}")
