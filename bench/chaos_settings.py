"""Settings for the chaos soak (``bench/chaos.py``) and the workers it starts.

``CHAOS_DB`` is ``sqlite``, ``postgresql`` or ``mysql``; the soak gets a
database of its own, ``intents_chaos`` plus ``CHAOS_DB_SUFFIX``, which it drops
and creates on every run. Connection settings come from the same environment
variables as the tests (``PGHOST``, ``MYSQL_HOST``, ...).
"""

import os
from pathlib import Path

from bench.databases import database
from bench.skew import SKEW_VARIABLE, skew_python_clocks

ROOT = Path(__file__).resolve().parent.parent
VENDOR = os.environ.get("CHAOS_DB", "sqlite")
NAME = "intents_chaos" + os.environ.get("CHAOS_DB_SUFFIX", "")
WORK = ROOT / ".tmp" / "chaos"
WORK.mkdir(parents=True, exist_ok=True)

DATABASES = {"default": database(VENDOR, NAME, WORK, variable="CHAOS_DB")}

SECRET_KEY = "django-intents-chaos"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_intents", "bench.chaosapp.apps.ChaosConfig"]
if SKEW_VARIABLE in os.environ:  # the soak's skewed worker, on SQLite
    skew_python_clocks(float(os.environ[SKEW_VARIABLE]))

INTENTS = {"LEASE": float(os.environ.get("CHAOS_LEASE", "2"))}
