"""The soak's handler: record the execution, work a while, complete (sometimes atomically).

The payload says how: ``seconds`` to work (a few are longer than the lease, so
renewals matter), ``patient`` (watch ``attempt.cancelled`` or ignore it, so
both a cooperative and a stubborn handler lose claims) and ``atomic``
(complete inside ``attempt.atomic()`` with a ``Completion`` row).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.dispatch import receiver

from django_intents import Attempt, handler
from django_intents.models import Intent
from django_intents.signals import attempt_finished

from .models import Completion, Execution

KIND = "chaos"


@handler(KIND)
def run(intent: Intent, attempt: Attempt) -> None:
    Execution.objects.create(
        intent_id=intent.id,
        claim_token=intent.claim_token,
        attempt=intent.attempts,
        pid=os.getpid(),
    )
    options = intent.payload
    if options["patient"]:
        attempt.cancelled.wait(options["seconds"])
        attempt.check()
    else:
        time.sleep(options["seconds"])
    if options["atomic"]:
        with attempt.atomic():
            Completion.objects.create(
                intent_id=intent.id,
                claim_token=intent.claim_token,
                attempt=intent.attempts,
                how="atomic",
            )


@receiver(attempt_finished)
def record_completion(*, outcome: str, intent: Intent, **kwargs: Any) -> None:
    if intent.kind == KIND and outcome == "success" and not intent.payload["atomic"]:
        Completion.objects.create(
            intent_id=intent.id,
            claim_token=intent.claim_token,
            attempt=intent.attempts,
            how="worker",
        )
