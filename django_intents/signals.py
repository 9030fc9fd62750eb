"""Signals sent by the manager and the worker.

Metrics and logging hang off these as receivers, so the hot paths carry no
bookkeeping of their own. Every signal is sent with ``sender=Intent``; transitions
made inside a transaction are announced once it commits.
"""

from django.dispatch import Signal

# kinds: list[str], one entry per intent that moved; to: the new state.
intents_transitioned = Signal()

# rescued: list[tuple[str, float]], (kind, seconds from lease expiry to the new claim).
intents_rescued = Signal()

# kind, outcome ("success", "error", "stopped", "fenced"), duration (seconds), intent.
attempt_finished = Signal()
