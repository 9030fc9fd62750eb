"""The ``default`` database of the benchmark and of the chaos soak, for one vendor.

Both get a database of their own, never the test suite's. Connection settings
come from the same environment variables as the tests (``PGHOST``,
``MYSQL_HOST``, ...); SQLite uses the project's documented settings
(docs/reference.md, SQLite).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def database(vendor: str, name: str, work: Path, *, variable: str) -> dict[str, Any]:
    """``DATABASES["default"]`` for ``vendor``; ``variable`` names the setting it came from."""
    if vendor == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(work / f"{name}.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    if vendor == "postgresql":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    if vendor == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    raise RuntimeError(f"{variable} must be sqlite, postgresql or mysql, not {vendor!r}")
