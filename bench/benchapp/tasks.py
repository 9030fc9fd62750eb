"""Procrastinate tasks (its Django app autodiscovers ``tasks`` modules)."""

from django.conf import settings

from . import io_calls, probe

if settings.SYSTEM == "procrastinate":
    from procrastinate.contrib.django import app

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
