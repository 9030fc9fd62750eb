"""A task intent as the admin shows it: what it runs and what became of it.

Read with the same record as ``get_result``, so the change page and Django's
API never disagree. It needs the task framework (``django_intents.tasks``), so
the admin imports it only where one is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_intents.admin.humanize import pre_json, truncated
from django_intents.rules.kinds import TASK_KIND
from django_intents.tasks.record import STATUS, MalformedRecord, TaskRecord

if TYPE_CHECKING:
    from django_intents.models import Intent

__all__ = ["TASK_KIND", "TASK_VALUE_LIMIT", "task_details"]

TASK_VALUE_LIMIT = 20_000  # per argument list, return value or traceback
TASK_VALUE_INLINE = 80  # JSON up to this long stays on one line


def task_details(intent: Intent) -> SafeString:
    """The rows of the change page's "Task" section, every value escaped."""
    if intent.payload is None:
        return format_html("<p>{}</p>", _("No task record: retention compacted the payload."))
    try:
        record = TaskRecord.from_payload(intent.payload)
    except MalformedRecord as exc:
        return format_html('<p class="intents-error">{}</p>', str(exc))
    rows: list[tuple[str, SafeString]] = [
        (_("Function"), format_html("<code>{}</code>", record.path)),
        (_("Arguments"), _value(record.args)),
        (_("Keyword arguments"), _value(record.kwargs)),
        (_("Status"), format_html("{}", STATUS[intent.state].label)),
        (_("Queue"), format_html("{} (backend {})", record.queue_name, record.backend)),
    ]
    if record.idempotency_key is not None:
        rows.append((_("Idempotency key"), format_html("<code>{}</code>", record.idempotency_key)))
    if record.worker_ids:
        rows.append((_("Workers"), format_html("{}", ", ".join(record.worker_ids))))
    if record.has_return_value:
        rows.append((_("Return value"), _value(record.return_value)))
    if record.errors:
        last = record.errors[-1]
        rows.append((_("Errors recorded"), format_html("{}", len(record.errors))))
        error = format_html(
            '<code>{}</code><pre class="intents-pre">{}</pre>',
            last.exception_class_path,
            truncated(last.traceback, TASK_VALUE_LIMIT),
        )
        rows.append((_("Last error"), error))
    return format_html(
        '<table class="intents-task"><tbody>{}</tbody></table>',
        format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>', rows),
    )


def _value(value: object) -> SafeString:
    return pre_json(value, TASK_VALUE_LIMIT, TASK_VALUE_INLINE)
