"""django-intents handlers for the benchmark (discovered by the worker pool)."""

from typing import Any

from django_intents import Retry, handler

from . import io_calls, partner_calls, probe, relay_calls


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


# -- relay workload: target = the partner's URL; payload {"at": enqueue epoch} ---


@handler("bench.relay")
async def relay(intent: Any, attempt: Any) -> None:
    """Deliver; a 429 (or a target blocked by one) is a snooze, which costs no attempt."""
    try:
        await relay_calls.deliver(intent.target, intent.event_id, intent.payload["at"])
    except relay_calls.Snooze as snooze:
        raise Retry(after=snooze.after, reason=snooze.reason) from None


# -- partners workload (bench/partners.py): one kind per kind of partner -------------


@handler("bench.partner.healthy")
async def partner_healthy(intent: Any, attempt: Any) -> None:
    await partner_calls.deliver(intent)


@handler("bench.partner.rate")
async def partner_rate(intent: Any, attempt: Any) -> None:
    """The rate-limited partner with ``"rate"`` in LIMITS: a rare 429 snoozes this intent only."""
    await partner_calls.deliver(intent)


@handler("bench.partner.hold")
async def partner_hold(intent: Any, attempt: Any) -> None:
    """The rate-limited partner without a rate: a 429 holds its whole target."""
    await partner_calls.deliver(intent, hold_target=True)


@handler("bench.partner.down")
async def partner_down(intent: Any, attempt: Any) -> None:
    """The partner that is down, then up, behind a breaker."""
    await partner_calls.deliver(intent)


@handler("bench.partner.redrive")
async def partner_redrive(intent: Any, attempt: Any) -> None:
    """The same partner without a breaker: its intents run out of attempts, then are redriven."""
    await partner_calls.deliver(intent)


@handler("bench.partner.ordered")
async def partner_ordered(intent: Any, attempt: Any) -> None:
    await partner_calls.deliver(intent)
