"""Settings for the chaos soak (``bench/chaos.py``) and the workers it starts.

``CHAOS_DB`` is ``sqlite``, ``postgresql`` or ``mysql``; the soak gets a
database of its own, ``intents_chaos`` plus ``CHAOS_DB_SUFFIX``, which it drops
and creates on every run. Connection settings come from the same environment
variables as the tests (``PGHOST``, ``MYSQL_HOST``, ...).
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = os.environ.get("CHAOS_DB", "sqlite")
NAME = "intents_chaos" + os.environ.get("CHAOS_DB_SUFFIX", "")
WORK = ROOT / ".tmp" / "chaos"
WORK.mkdir(parents=True, exist_ok=True)

if VENDOR == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(WORK / f"{NAME}.sqlite3"),
            # The documented SQLite settings (docs/reference.md, SQLite).
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
elif VENDOR == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    }
elif VENDOR == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
else:
    raise RuntimeError(f"CHAOS_DB must be sqlite, postgresql or mysql, not {VENDOR!r}")

SECRET_KEY = "django-intents-chaos"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_intents", "bench.chaosapp.apps.ChaosConfig"]
INTENTS = {"LEASE": float(os.environ.get("CHAOS_LEASE", "2"))}
