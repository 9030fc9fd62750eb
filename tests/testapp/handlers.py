"""Handlers the worker tests run, discovered like any app's ``handlers.py``.

Each one leaves ``Effect`` rows behind, so a test in another process can see
what ran, in which attempt, and when it noticed ``attempt.cancelled``. Kinds
are prefixed ``test.`` to stay out of the way of anything else registered.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django_intents import Attempt, Retry, Stop, handler
from django_intents.models import Intent

from .models import Effect

# Longest any handler waits for something; far beyond every test's own timeout.
PATIENCE = 60.0


# The ``limit:`` partner's count, taken by one worker thread at a time.
_PARTNER = threading.Lock()


def note(intent: Intent, text: str) -> None:
    Effect.objects.create(intent_id=intent.id, claim_token=intent.claim_token, note=text)


def options(intent: Intent) -> dict[str, Any]:
    return intent.payload if isinstance(intent.payload, dict) else {}


@handler("test.ok")
def ok(intent: Intent, attempt: Attempt) -> None:
    note(intent, f"ok {intent.attempts}")


@handler("test.fail")
def fail(intent: Intent, attempt: Attempt) -> None:
    raise ValueError(f"boom {options(intent).get('n')}")


@handler("test.stop")
def stop(intent: Intent, attempt: Attempt) -> None:
    raise Stop("gone for good")


@handler("test.sleepy")
def sleepy(intent: Intent, attempt: Attempt) -> None:
    """Sleep ``seconds``, watching ``attempt.cancelled`` unless told to ignore it.

    ``on_cancel``: ``"raise"`` (``attempt.check()``), ``"return"`` (return at once)
    or ``"ignore"`` (sleep on). Only attempts up to ``slow_attempts`` sleep.
    """
    opts = options(intent)
    note(intent, f"start {intent.attempts}")
    if intent.attempts > opts.get("slow_attempts", intent.attempts):
        return
    on_cancel = opts.get("on_cancel", "raise")
    deadline = time.monotonic() + opts.get("seconds", PATIENCE)
    while (left := deadline - time.monotonic()) > 0:
        if on_cancel == "ignore":
            time.sleep(min(left, 0.05))
        elif attempt.cancelled.wait(left):
            note(intent, f"cancelled {intent.attempts} {time.time():.3f}")
            if on_cancel == "raise":
                attempt.check()
            return
    note(intent, f"done {intent.attempts}")


@handler("test.atomic")
def atomic(intent: Intent, attempt: Attempt) -> None:
    """Write an Effect inside ``attempt.atomic()``; first wait for a lost claim if asked."""
    note(intent, f"start {intent.attempts}")
    if intent.attempts <= options(intent).get("wait_cancel_attempts", 0):
        attempt.cancelled.wait(PATIENCE)
    with attempt.atomic():
        note(intent, f"atomic {intent.attempts}")


@handler("test.partner")
def partner(intent: Intent, attempt: Attempt) -> None:
    """A partner per target: notes ``<target> <attempt> <unix time>`` at each start, then
    answers as the target is switched (an ``Effect`` with ``intent_id="switch"`` and
    ``note="<target> <mode>"``, the last one wins): ``up`` (the default) succeeds,
    ``down`` fails, ``429:<seconds>`` snoozes holding the target, ``limit:<n>:<seconds>``
    takes ``n`` requests in any window of that many seconds (each noted as an
    ``Effect`` with ``intent_id="accepted"``) and answers the rest 429 with a
    ``Retry-After`` of the window."""
    note(intent, f"{intent.target} {intent.attempts} {time.time():.3f}")
    time.sleep(options(intent).get("seconds", 0.0))
    switches = Effect.objects.filter(intent_id="switch", note__startswith=f"{intent.target} ")
    last = switches.order_by("-id").first()
    mode = last.note.split(" ", 1)[1] if last else "up"
    if mode == "down":
        raise ConnectionError(f"{intent.target} refused the connection")
    if mode.startswith("429:"):
        raise Retry(after=float(mode[4:]), reason="429 Too Many Requests", hold_target=True)
    if mode.startswith("limit:"):
        count, seconds = (float(part) for part in mode.split(":")[1:])
        with _PARTNER:  # one partner counts one request at a time, as a real one does
            now = time.time()
            accepted = Effect.objects.filter(
                intent_id="accepted", note__startswith=f"{intent.target} "
            )
            notes = accepted.values_list("note", flat=True)
            if sum(float(t.split()[1]) > now - seconds for t in notes) >= count:
                raise Retry(after=seconds, reason="429 Too Many Requests", hold_target=True)
            Effect.objects.create(
                intent_id="accepted", claim_token="", note=f"{intent.target} {now:.3f}"
            )


@handler("test.stamp")
def stamp(intent: Intent, attempt: Attempt) -> None:
    """Record the wall-clock start time, for the enqueue -> start latency benchmark."""
    started = time.time()
    note(intent, f"{started:.6f}")


def dotted(intent: Intent, attempt: Attempt) -> None:
    """Registered through INTENTS["HANDLERS"], not the decorator."""
    note(intent, "dotted")
