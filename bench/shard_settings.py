"""Settings for ``bench/shards.py``: the relay workload's app over one or two PostgreSQL servers.

``BENCH_SHARDS`` lists ``host:port/name`` per database, the first as
``default``, the others as ``shard1``, ...; ``TargetShardRouter`` spreads the
targets over all of them (``INTENTS["DATABASES"]``).
"""

import os

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES, INTENTS

_base = DATABASES["default"]
_aliases = []
for number, spec in enumerate(os.environ["BENCH_SHARDS"].split(",")):
    address, name = spec.split("/")
    host, port = address.split(":")
    alias = "default" if number == 0 else f"shard{number}"
    DATABASES[alias] = {**_base, "HOST": host, "PORT": port, "NAME": name}
    _aliases.append(alias)

DATABASE_ROUTERS = ["django_intents.routers.TargetShardRouter"]
INTENTS = {**INTENTS, "DATABASES": _aliases}
