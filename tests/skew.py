"""A worker subprocess's environment with its clock off the database's (``bench/skew.py``)."""

from __future__ import annotations

import os

import pytest
from django.db import connection

from bench.skew import skewed_env


def skewed(seconds: int) -> dict[str, str]:
    env = skewed_env(connection.vendor, seconds)
    if env is None:
        reason = "a worker with a skewed clock on a database server needs a C compiler (apt-get install gcc)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this is a failure, not a skip")
        pytest.skip(reason)
    return env
