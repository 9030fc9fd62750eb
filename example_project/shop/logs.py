"""Keep Django's request logs free of the receiver's deliberate refusals."""

from __future__ import annotations

import logging

RECEIVER_PATH = "/webhooks/receive/"


class NotReceiver(logging.Filter):
    """Drop ``django.request`` and ``django.server`` records about the webhook receiver.

    The receiver plays a flaky partner: it answers 503 or 410 on purpose so that
    retries and cancellations can be seen, and logs every refusal itself. Django
    would log each of those responses again, twice, as errors.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", None)
        if path is None and record.name == "django.server" and isinstance(record.args, tuple):
            # runserver logs '"%s" %s %s' % (request line, status, size).
            words = str(record.args[0]).split() if record.args else []
            path = words[1] if len(words) > 1 else None
        return not (path or "").startswith(RECEIVER_PATH)
