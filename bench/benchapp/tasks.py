"""Procrastinate tasks (its Django app autodiscovers ``tasks`` modules)."""

from django.conf import settings

from . import probe

if settings.SYSTEM == "procrastinate":
    from procrastinate.contrib.django import app

    @app.task(name="noop")
    def noop(n: int = 0) -> None:
        probe.noop()

    @app.task(name="stamp")
    def stamp(key: str) -> None:
        probe.stamp(key)
