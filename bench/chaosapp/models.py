"""What the soak's handler leaves behind, to be checked against the queue at the end."""

from django.db import models


class Execution(models.Model):
    """One run of the handler: written in its own transaction, before the work."""

    intent_id = models.CharField(max_length=64, db_index=True)
    claim_token = models.CharField(max_length=32)
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.intent_id[:12]} attempt {self.attempt} in pid {self.pid}"


class Completion(models.Model):
    """Which claim completed an intent.

    ``atomic``: written in ``attempt.atomic()``, so it commits with the
    completion or not at all. ``worker``: written by an ``attempt_finished``
    receiver after the worker recorded the success, so a worker killed between
    the two leaves no row (the intent is then "unobserved", not wrong).
    """

    intent_id = models.CharField(max_length=64, db_index=True)
    claim_token = models.CharField(max_length=32)
    attempt = models.PositiveIntegerField()
    how = models.CharField(max_length=10)

    def __str__(self) -> str:
        return f"{self.intent_id[:12]} completed by attempt {self.attempt} ({self.how})"
