"""The soak's handler: record the execution, work a while, complete (sometimes atomically).

The payload says how: ``seconds`` to work (a few are longer than the lease, so
renewals matter), ``patient`` (watch ``attempt.cancelled`` or ignore it, so
both a cooperative and a stubborn handler lose claims) and ``atomic``
(complete inside ``attempt.atomic()`` with a ``Completion`` row).

The soak terminates database connections under the handler too. A handler's
own bookkeeping failing that way is the infrastructure, not the work, so it
asks for a short snooze as a relay would: a ``Retry(after=...)`` does not
lengthen the backoff, and without it an intent whose connection was cut a few
times waits minutes for its next attempt, past the soak's drain.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import Error as DatabaseError
from django.dispatch import receiver

from django_intents import Attempt, Retry, handler
from django_intents.models import Intent
from django_intents.signals import attempt_finished

from .models import Completion, Execution

KIND = "chaos"


SNOOZE_SECONDS = 0.5


@handler(KIND)
def run(intent: Intent, attempt: Attempt) -> None:
    try:
        work(intent, attempt)
    except DatabaseError as exc:
        raise Retry(after=SNOOZE_SECONDS, reason=f"database: {exc}") from exc


def work(intent: Intent, attempt: Attempt) -> None:
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
