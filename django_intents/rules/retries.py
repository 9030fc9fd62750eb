"""When a failed intent runs again, and when it never does.

``retry_at`` is the retry-or-cancel decision of a failed attempt, and
``counted`` the attempts it counts: the manager's ``retry`` and the pool's
recorder ask ``retry_at``; the django.tasks runner asks ``gives_up`` with
``counted`` for its own bound too. The claim leaves an expired lease that
used the last attempt to the store, which writes the same comparison in SQL
(``attempts >= snoozes + written_off + MAX_ATTEMPTS``, the fragment ``uncounted``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django_intents.rules.validation import later

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow

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


def counted(intent: IntentRow) -> int:
    """The attempts of ``intent`` that count: snoozes (``Retry(after=...)``) never
    exhaust ``MAX_ATTEMPTS`` nor lengthen the backoff, and a redrive writes off
    the attempts made before it (``Intent.objects.redrive``)."""
    return intent.attempts - intent.snoozes - intent.written_off


def gives_up(attempts: int, max_attempts: int | None) -> bool:
    """Whether an intent that failed on attempt number ``attempts`` is cancelled, not retried.

    Retries are unbounded unless ``INTENTS["MAX_ATTEMPTS"]`` is set.
    """
    return max_attempts is not None and attempts >= max_attempts


def retry_at(id: str, attempts: int, max_attempts: int | None, now: datetime) -> datetime | None:  # noqa: A002
    """When intent ``id``, failed at ``now`` on counted attempt ``attempts``, runs again:
    after its ``backoff``, or ``None`` when it has used its last attempt and is cancelled."""
    if gives_up(attempts, max_attempts):
        return None
    return later(now, backoff(id, attempts), "backoff")
