"""Exceptions a handler raises or receives."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone


class Stop(Exception):  # noqa: N818 - a public name, not an error class
    """Raised by a handler to cancel its intent for good; the message is kept as ``last_error``."""


class ClaimLost(Exception):  # noqa: N818 - a public name, not an error class
    """The worker no longer holds the claim: another worker or an administrator took over."""


class Retry(Exception):  # noqa: N818 - a public name, not an error class
    """Raised by a handler to run its intent again later; ``reason`` is kept as ``last_error``.

    Without ``after`` it is an ordinary failure: the usual backoff, and it
    counts toward ``MAX_ATTEMPTS``. With ``after`` it is a *snooze* (a partner
    answered 429 with ``Retry-After``, say): due ``after`` from now, and it
    never exhausts ``MAX_ATTEMPTS``, since nothing went wrong with the intent.
    ``after`` is seconds, a ``timedelta`` or an aware ``datetime``; a bad one
    raises ``ValueError`` here, in the handler, so it is recorded as the
    handler's error instead of snoozing for a time nobody meant.

    ``hold_target=True`` (SPEC §14) also holds every pending intent of the
    same kind and target until ``after`` has passed: none of them is claimed
    before then, none burns an attempt (a 429 or a 503 with ``Retry-After``
    is about the partner, not the one request).
    """

    def __init__(
        self,
        after: float | timedelta | datetime | None = None,
        reason: str = "",
        *,
        hold_target: bool = False,
    ) -> None:
        super().__init__(reason)
        self.after = _checked_after(after)
        self.reason = str(reason)
        if not isinstance(hold_target, bool):
            raise TypeError(
                f"Retry(hold_target=...) takes True or False, not {type(hold_target).__name__}"
            )
        if hold_target and self.after is None:
            raise ValueError("Retry(hold_target=True) needs after=: how long to hold the target")
        self.hold_target = hold_target

    def due(self, now: datetime) -> datetime | None:
        """When the snoozed intent runs again (never before ``now``); ``None``: not a snooze."""
        if self.after is None:
            return None
        if isinstance(self.after, datetime):
            return max(self.after, now)
        return now + self.after


def _checked_after(after: object) -> timedelta | datetime | None:
    if after is None:
        return None
    if isinstance(after, bool) or not isinstance(after, (int, float, timedelta, datetime)):
        raise ValueError(
            f"Retry(after=...) takes seconds, a timedelta or an aware datetime, "
            f"not {type(after).__name__}"
        )
    if isinstance(after, datetime):
        if timezone.is_naive(after):
            raise ValueError(f"Retry(after={after!r}): a naive datetime; give an aware one")
        return after
    delay = after if isinstance(after, timedelta) else timedelta(seconds=after)
    if delay < timedelta(0):
        raise ValueError(f"Retry(after={after!r}): a negative delay")
    return delay
