"""``upgrade.ok`` for the previous release's processes, which install this app."""

from django_intents import handler

from .work import ok

handler("upgrade.ok")(ok)
