"""Signals sent by the manager and the worker, and the outcomes an attempt can have.

Metrics and logging hang off these as receivers, so the hot paths carry no
bookkeeping of their own. Every signal is sent with ``sender=Intent``; transitions
made inside a transaction are announced once it commits.
"""

from enum import StrEnum

from django.dispatch import Signal


class Outcome(StrEnum):
    """How one handler attempt ended, as metrics and logs name it."""

    SUCCESS = "success"  # completed
    ERROR = "error"  # raised: retried later, or cancelled at MAX_ATTEMPTS
    STOPPED = "stopped"  # raised Stop: cancelled for good
    SNOOZED = "snoozed"  # raised Retry(after=...): due later, not counted toward MAX_ATTEMPTS
    FENCED = "fenced"  # the claim was lost (or released at shutdown): the result was dropped
    TIMEOUT = "timeout"  # ran past its timeout: a failure, retried or cancelled at MAX_ATTEMPTS


# Every signal also carries database: the alias of the database where it happened
# (issue 41: the metrics' ``database`` label).

# kinds: list[str], one entry per intent that moved; to: the new state.
intents_transitioned = Signal()

# rescued: list[tuple[str, float]], (kind, seconds from lease expiry to the new claim).
intents_rescued = Signal()

# kind, outcome (an Outcome), duration (seconds), intent. Sent once per
# attempt, always with sender=Intent: its receivers are looked up once per
# sender, as Django does for pre_init and post_init, not on every attempt.
attempt_finished = Signal(use_caching=True)

# kind, target, state (a rules.targets.TargetHealth), previous (the state before):
# a target was held, opened, half-opened or closed (SPEC §14).
target_state_changed = Signal()
