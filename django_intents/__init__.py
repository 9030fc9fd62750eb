"""django-intents: durable work intents with leases and fencing, in your Django database."""

from importlib.metadata import PackageNotFoundError, version

from django_intents.attempt import Attempt
from django_intents.exceptions import ClaimLost, Retry, Stop
from django_intents.handlers import handler
from django_intents.rules.headers import retry_after
from django_intents.rules.identity import intent_id
from django_intents.rules.retries import backoff

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
    "retry_after",
]
