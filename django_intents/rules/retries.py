"""When a failed intent runs again, and when it never does.

One place decides "retry or give up": the manager's ``retry``, the claim's
treatment of an expired lease, the worker's log line and the django.tasks
runner all ask ``gives_up``.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

MAX_DELAY_SECONDS = 3600


def backoff(id: str, attempts: int) -> timedelta:  # noqa: A002 - the public name
    """Return the delay before retry number ``attempts`` of intent ``id``.

    The jitter comes from the id, not a random source, so two workers (or a test)
    compute the same schedule, while different intents that failed together
    spread out instead of retrying in lock step.
    """
    a = max(attempts, 1)
    base = min(2 ** min(a, 12), MAX_DELAY_SECONDS)  # 2**12 > 3600: no giant integers
    byte = hashlib.sha256((id + str(a)).encode()).digest()[0]
    jitter = (byte / 255 - 0.5) * 0.4
    return timedelta(seconds=int(base * (1 + jitter)))


def gives_up(attempts: int, max_attempts: int | None) -> bool:
    """Whether an intent that failed on attempt number ``attempts`` is cancelled, not retried.

    Retries are unbounded unless ``INTENTS["MAX_ATTEMPTS"]`` is set.
    """
    return max_attempts is not None and attempts >= max_attempts
