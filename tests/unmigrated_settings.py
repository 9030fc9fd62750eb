"""Worker settings whose database was never migrated: ``NAME`` from INTENTS_TEST_UNMIGRATED.

For the tests of a pool started before ``migrate``: an SQLite path that may
not exist yet, or the name of an empty PostgreSQL or MySQL database.
"""

import os

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import DATABASES

DATABASES["default"]["NAME"] = os.environ["INTENTS_TEST_UNMIGRATED"]
