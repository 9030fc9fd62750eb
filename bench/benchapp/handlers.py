"""django-intents handlers for the benchmark (discovered by the worker pool)."""

from typing import Any

from django_intents import handler

from . import probe


@handler("bench.noop")
def noop(intent: Any, attempt: Any) -> None:
    probe.noop()


@handler("bench.stamp")
def stamp(intent: Any, attempt: Any) -> None:
    probe.stamp(intent.event_id)


@handler("bench.block")
def block(intent: Any, attempt: Any) -> None:
    probe.block(intent.event_id)
