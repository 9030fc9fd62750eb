"""django-intents: durable work intents with leases and fencing, in your Django database."""

from importlib.metadata import PackageNotFoundError, version

from .attempt import Attempt
from .exceptions import ClaimLost, Retry, Stop
from .handlers import handler
from .identity import intent_id
from .retries import backoff

try:
    __version__ = version("django-intents")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "Attempt",
    "ClaimLost",
    "Retry",
    "Stop",
    "__version__",
    "backoff",
    "handler",
    "intent_id",
]
