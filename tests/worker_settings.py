"""Settings for worker subprocesses started by the tests: the same test database.

pytest-django points the test process at ``TEST["NAME"]``; a subprocess only
sees ``tests.settings``, so this module makes ``NAME`` the test database.
``INTENTS_TEST_INTENTS`` (JSON) adds ``INTENTS`` keys, ``INTENTS_TEST_CONN_MAX_AGE``
sets ``CONN_MAX_AGE`` and ``INTENTS_TEST_UNREACHABLE`` points an alias (``1``:
``default``) at a database that cannot be reached. ``INTENTS_PYTHON_CLOCK_SKEW`` moves the worker's Python clocks (``bench/skew.py``).
"""

import json
import os

from bench.skew import SKEW_VARIABLE, skew_python_clocks
from tests.settings import *  # noqa: F403
from tests.settings import BASE_DIR, DATABASES, INTENTS

DATABASES["default"]["NAME"] = DATABASES["default"]["TEST"]["NAME"]
if "shard" in DATABASES:  # tests/test_shards.py's second database, and its replica
    DATABASES["shard"]["NAME"] = DATABASES["shard"]["TEST"]["NAME"]
    DATABASES["replica"]["NAME"] = DATABASES["default"]["NAME"]
if "direct" in DATABASES:  # the pgbouncer configuration's unpooled alias, for LISTEN
    DATABASES["direct"]["NAME"] = DATABASES["default"]["NAME"]
if "INTENTS_TEST_CONN_MAX_AGE" in os.environ:
    max_age = os.environ["INTENTS_TEST_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if max_age == "None" else int(max_age)
if os.environ.get("INTENTS_TEST_UNREACHABLE"):  # "1": the default alias; else the alias named
    down = os.environ["INTENTS_TEST_UNREACHABLE"]
    down = "default" if down == "1" else down
    if DATABASES[down]["ENGINE"].endswith("sqlite3"):
        DATABASES[down]["NAME"] = str(BASE_DIR / ".tmp" / "no-such-dir" / "db.sqlite3")
    else:
        DATABASES[down]["PORT"] = "1"

if SKEW_VARIABLE in os.environ:
    skew_python_clocks(float(os.environ[SKEW_VARIABLE]))

INTENTS = {
    **INTENTS,
    "HANDLERS": {"test.dotted": "tests.testapp.handlers.dotted"},
    **json.loads(os.environ.get("INTENTS_TEST_INTENTS", "{}")),
}
