"""How the admin writes times and stored values for people, in one place.

Shared by the intents admin and its task block (``admin.tasks``), which the
admin imports only where a task framework is installed.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.formats import localize
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _


def short_duration(seconds: float) -> str:
    """``45 s``, ``3 min``, ``5 h``, ``2 d``: coarse on purpose, a queue is read at a glance."""
    seconds = abs(seconds)
    if seconds < 90:
        return _("%(n)d s") % {"n": round(seconds)}
    if seconds < 90 * 60:
        return _("%(n)d min") % {"n": round(seconds / 60)}
    if seconds < 36 * 3600:
        return _("%(n)d h") % {"n": round(seconds / 3600)}
    return _("%(n)d d") % {"n": round(seconds / 86400)}


def relative(moment: datetime, now: datetime) -> str:
    """``in 3 min`` or ``2 min ago``."""
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 1:
        return _("now")
    if seconds > 0:
        return _("in %(duration)s") % {"duration": short_duration(seconds)}
    return _("%(duration)s ago") % {"duration": short_duration(seconds)}


def timestamp(moment: datetime, text: str) -> SafeString:
    """``text``, with the exact local time on hover."""
    return format_html('<span title="{}">{}</span>', localize(timezone.localtime(moment)), text)


def truncated(text: str, limit: int) -> str:
    """``text`` cut at ``limit`` characters, saying so: one huge value must not stall a page."""
    if len(text) <= limit:
        return text
    return text[:limit] + "\n" + _("… (%(count)d characters, truncated)") % {"count": len(text)}


def pre_json(value: Any, limit: int, inline: int | None = None) -> SafeString:
    """``value`` as JSON in a ``<pre>``: on one line up to ``inline`` characters, else indented.

    Keys are sorted: PostgreSQL and MySQL store JSON objects in their own key order anyway.
    """
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if inline is None or len(text) > inline:
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html('<pre class="intents-pre">{}</pre>', truncated(text, limit))
