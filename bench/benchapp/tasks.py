"""Procrastinate tasks (its Django app autodiscovers ``tasks`` modules)."""

from django.conf import settings

from . import io_calls, probe, relay_calls

if settings.SYSTEM == "procrastinate":
    from typing import Any

    from procrastinate import BaseRetryStrategy, RetryDecision
    from procrastinate.contrib.django import app

    class RelayRetry(BaseRetryStrategy):
        """A 429 runs the job again after ``Retry-After``, anything else after 2, 4, 8 s...

        The same schedule as django-intents' backoff, and never giving up, as
        the intents of the relay workload (no ``MAX_ATTEMPTS``). Procrastinate's
        ``attempts`` counts both, so the exponent is capped.
        """

        def get_retry_decision(self, *, exception: BaseException, job: Any) -> RetryDecision:
            if isinstance(exception, relay_calls.Snooze):
                return RetryDecision(retry_in={"seconds": exception.after})
            return RetryDecision(retry_in={"seconds": 2 ** min(job.attempts + 1, 12)})

    @app.task(name="relay", retry=RelayRetry())
    async def relay(target: str, key: str, at: float) -> None:
        await relay_calls.deliver(target, key, at)

    @app.task(name="noop")
    def noop(n: int = 0) -> None:
        probe.noop()

    @app.task(name="stamp")
    def stamp(key: str) -> None:
        probe.stamp(key)

    @app.task(name="io_asleep")
    async def io_asleep(fail: bool = False) -> None:
        await io_calls.async_call("sleep", fail)

    @app.task(name="io_ahttp")
    async def io_ahttp(fail: bool = False) -> None:
        await io_calls.async_call("http", fail)
