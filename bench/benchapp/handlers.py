"""django-intents handlers for the benchmark (discovered by the worker pool)."""

from typing import Any

from django_intents import handler

from . import io_calls, probe


@handler("bench.noop")
def noop(intent: Any, attempt: Any) -> None:
    probe.noop()


@handler("bench.stamp")
def stamp(intent: Any, attempt: Any) -> None:
    probe.stamp(intent.event_id)


@handler("bench.block")
def block(intent: Any, attempt: Any) -> None:
    probe.block(intent.event_id)


# -- io workload: payload {"fail": bool}; the wait itself is in io_calls -------


@handler("bench.io.sleep")
def io_sleep(intent: Any, attempt: Any) -> None:
    io_calls.sync_call("sleep", intent.payload["fail"])


@handler("bench.io.http")
def io_http(intent: Any, attempt: Any) -> None:
    io_calls.sync_call("http", intent.payload["fail"])


@handler("bench.io.asleep")
async def io_asleep(intent: Any, attempt: Any) -> None:
    await io_calls.async_call("sleep", intent.payload["fail"])


@handler("bench.io.ahttp")
async def io_ahttp(intent: Any, attempt: Any) -> None:
    await io_calls.async_call("http", intent.payload["fail"])
