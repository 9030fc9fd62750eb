"""Task intents in the admin: the function, its arguments and what came of it, escaped.

A task intent's change page has a *Task* section read from its payload with the
helpers ``get_result`` uses (django_intents/tasks/record.py); the changelist
shows its function as the target. Tasks are enqueued through Django's API
(tests/testapp/tasks.py) and, where a result is needed, run by a real pool.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterator

import pytest
from django.test import Client
from django.urls import reverse

from django_intents import admin as intents_admin
from django_intents.admin.tasks import TASK_VALUE_LIMIT
from django_intents.handlers import discover
from django_intents.models import Intent
from django_intents.tasks import TASK_KIND
from django_intents.worker.pool import WorkerPool
from tests.testapp import tasks

CHANGELIST = reverse("admin:django_intents_intent_changelist")
SCRIPT = "<script>alert(1)</script>"
ESCAPED_SCRIPT = "&lt;script&gt;alert(1)&lt;/script&gt;"
TASK_ROW = re.compile(r'<tr><th scope="row">(.*?)</th><td>(.*?)</td></tr>', re.DOTALL)


def change_url(id: str) -> str:  # noqa: A002
    return reverse("admin:django_intents_intent_change", args=[id])


def task_section(client: Client, id: str) -> dict[str, str]:  # noqa: A002
    """The change page's task rows, label to HTML, after checking the page as a whole."""
    response = client.get(change_url(id))
    assert response.status_code == 200
    html = response.content.decode()
    assert SCRIPT not in html
    table = re.search(r'<table class="intents-task">(.*?)</table>', html, re.DOTALL)
    assert table is not None, html
    return dict(TASK_ROW.findall(table.group(1)))


def pre(text: str) -> str:
    return f'<pre class="intents-pre">{text}</pre>'


def drain() -> None:
    """Run every due task intent in this process, as ``run_intent_workers --drain`` would."""
    pool = WorkerPool(handlers={TASK_KIND: discover()[TASK_KIND]}, drain=True, handle_signals=False)
    assert pool.run() == 0


@pytest.fixture
def hide_task_framework(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Make it look, to the admin, like Django 5.2 without the django-tasks backport.

    There the admin's guarded import of ``django_intents.admin.tasks`` fails;
    this undoes that import, and proves the guard would fail in that setting.
    """

    def hide() -> None:
        monkeypatch.setitem(sys.modules, "django.tasks", None)
        monkeypatch.setitem(sys.modules, "django_tasks", None)
        for name in [
            n
            for n in sys.modules
            if n.startswith(("django_intents.tasks", "django_intents.admin.tasks"))
        ]:
            monkeypatch.delitem(sys.modules, name)
        with pytest.raises(ImportError):
            importlib.import_module("django_intents.admin.tasks")
        monkeypatch.setattr(intents_admin, "task_display", None)

    yield hide


def has_task_fieldset(html: str) -> bool:
    return re.search(r"<h2[^>]*>Task</h2>", html) is not None


@pytest.mark.django_db
def test_a_pending_tasks_page_shows_its_function_arguments_and_status(admin_client):
    result = tasks.echo.using(idempotency_key="order-7").enqueue(7, "ada", note="first")

    rows = task_section(admin_client, result.id)

    assert list(rows) == [
        "Function",
        "Arguments",
        "Keyword arguments",
        "Status",
        "Queue",
        "Idempotency key",
    ]
    assert rows["Function"] == "<code>tests.testapp.tasks.echo</code>"
    assert rows["Arguments"] == pre("[7, &quot;ada&quot;]")
    assert rows["Keyword arguments"] == pre("{&quot;note&quot;: &quot;first&quot;}")
    assert rows["Status"] == "Ready"
    assert rows["Queue"] == "default (backend default)"
    assert rows["Idempotency key"] == "<code>order-7</code>"


@pytest.mark.django_db(transaction=True)
def test_a_finished_tasks_page_shows_its_return_value_escaped(admin_client):
    result = tasks.echo.enqueue(SCRIPT, n=[1, 2])
    drain()

    rows = task_section(admin_client, result.id)

    assert rows["Arguments"] == pre(f"[&quot;{ESCAPED_SCRIPT}&quot;]")
    assert rows["Keyword arguments"] == pre("{&quot;n&quot;: [1, 2]}")
    assert rows["Status"] == "Successful"
    assert rows["Return value"] == pre(
        f"{{&quot;args&quot;: [&quot;{ESCAPED_SCRIPT}&quot;], "
        "&quot;kwargs&quot;: {&quot;n&quot;: [1, 2]}}"
    )
    assert re.fullmatch(r"[^,<>]+:\d+", rows["Workers"])  # host:pid of the one attempt
    assert "Last error" not in rows


@pytest.mark.django_db(transaction=True)
def test_a_failing_tasks_page_shows_its_last_error_and_traceback_escaped(admin_client):
    result = tasks.fail.enqueue(SCRIPT)
    drain()

    rows = task_section(admin_client, result.id)

    assert rows["Status"] == "Failed"
    assert rows["Errors recorded"] == "1"
    assert rows["Last error"].startswith(
        '<code>builtins.ValueError</code><pre class="intents-pre">'
    )
    assert "Traceback (most recent call last):" in rows["Last error"]
    assert rows["Last error"].endswith(f"ValueError: {ESCAPED_SCRIPT}\n</pre>")
    assert "Return value" not in rows


@pytest.mark.django_db
def test_a_long_argument_list_is_indented_and_a_huge_one_truncated(admin_client):
    long = tasks.echo.enqueue(*range(40)).id
    huge = tasks.echo.enqueue("x" * (TASK_VALUE_LIMIT + 10)).id

    indented = task_section(admin_client, long)["Arguments"]
    assert indented.startswith('<pre class="intents-pre">[\n  0,\n  1,\n')
    shown = task_section(admin_client, huge)["Arguments"]
    assert "characters, truncated)</pre>" in shown
    assert len(shown) < TASK_VALUE_LIMIT + 200


@pytest.mark.django_db
def test_a_task_intent_whose_payload_is_not_a_task_record_says_so_escaped(admin_client):
    id = Intent.objects.enqueue(TASK_KIND, "e", "tests.testapp.tasks.add", {"task": SCRIPT})

    response = admin_client.get(change_url(id))

    html = response.content.decode()
    assert response.status_code == 200
    assert SCRIPT not in html
    assert has_task_fieldset(html)
    assert re.search(r'<p class="intents-error">the payload is not a task record: [^<]*</p>', html)


@pytest.mark.django_db
def test_a_compacted_task_intent_says_its_record_is_gone(admin_client):
    result = tasks.add.enqueue(2, 3)
    Intent.objects.filter(pk=result.id).update(state="completed", payload=None)

    html = admin_client.get(change_url(result.id)).content.decode()

    assert "No task record: retention compacted the payload." in html


@pytest.mark.django_db
def test_other_kinds_have_no_task_section(admin_client):
    id = Intent.objects.enqueue("webhook", "e", "https://partner.example/", {"task": "x"})

    html = admin_client.get(change_url(id)).content.decode()

    assert "intents-task" not in html
    assert not has_task_fieldset(html)


@pytest.mark.django_db
def test_the_changelist_shows_a_tasks_function_as_its_target(admin_client):
    tasks.add.enqueue(2, 3)

    html = admin_client.get(CHANGELIST).content.decode()

    assert '<td class="field-kind">django.tasks</td>' in html
    assert (
        '<span class="intents-target" title="tests.testapp.tasks.add">'
        "tests.testapp.tasks.add</span>"
    ) in html


@pytest.mark.django_db
def test_without_a_task_framework_a_task_intents_page_shows_its_payload(
    admin_client, hide_task_framework
):
    result = tasks.echo.enqueue(SCRIPT)
    assert has_task_fieldset(admin_client.get(change_url(result.id)).content.decode())
    hide_task_framework()

    response = admin_client.get(change_url(result.id))

    html = response.content.decode()
    assert response.status_code == 200
    assert not has_task_fieldset(html)
    assert "intents-task" not in html
    assert f"&quot;args&quot;: [\n    &quot;{ESCAPED_SCRIPT}&quot;\n  ]" in html
