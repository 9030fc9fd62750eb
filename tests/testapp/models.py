from django.db import models


class Effect(models.Model):
    """A row a handler writes, to prove writes and completion commit together."""

    intent_id = models.CharField(max_length=64)
    claim_token = models.CharField(max_length=32)
    note = models.CharField(max_length=100, blank=True, default="")
