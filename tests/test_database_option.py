"""``--database ALIAS`` on every command (SPEC §12): that alias, not the router's choice.

The router here sends the app's tables to an alias that does not exist, so
any step that forgets the option (a pool's claim, its clock, its schedules,
a prune, the health check's read) fails loudly instead of quietly reading
the default database.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_intents.models import Intent
from django_intents.observability.gauges import PENDING, QUEUE
from django_intents.store.clock import server_now

from .conftest import intents
from .testapp.models import Effect

COMMANDS = [
    ["run_intent_workers", "--drain"],
    ["prune_intents"],
    ["intents_health"],
    ["intents_pause", "webhook"],
    ["intents_resume", "webhook"],
    ["intents_schedules"],
]


class ElsewhereRouter:
    """The app's models to an alias that does not exist; every other model as usual."""

    def db_for_write(self, model, **hints):
        return "elsewhere" if model._meta.app_label == "django_intents" else None

    db_for_read = db_for_write


ELSEWHERE = {"DATABASE_ROUTERS": [f"{__name__}.ElsewhereRouter"]}


def run(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


@pytest.fixture
def quiet_pool_logs(monkeypatch):
    logger = logging.getLogger("django_intents")  # run_intent_workers configures it
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))


@pytest.mark.django_db
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unknown_alias_is_refused_naming_it_and_nothing_is_written(command):
    Intent.objects.enqueue("webhook", "kept", "https://example.com/hook")
    with pytest.raises(CommandError, match=r"unknown database alias 'nowhere' \(DATABASES has"):
        run(*command, "--database", "nowhere")
    assert list(Intent.objects.values_list("state", flat=True)) == ["pending"]
    assert Intent.objects.paused() == set()


@pytest.mark.django_db(transaction=True)
def test_a_pool_on_the_named_alias_drains_it_without_asking_the_router(quiet_pool_logs):
    ids = [Intent.objects.enqueue("test.ok", f"e{i}", "t") for i in range(3)]
    with override_settings(**ELSEWHERE, INTENTS=intents(POLL_INTERVAL=0.05)):
        run("run_intent_workers", "--drain", "--kinds", "test.ok", "--database", "default")
    assert set(Intent.objects.values_list("state", flat=True)) == {"completed"}
    assert sorted(Effect.objects.values_list("intent_id", flat=True)) == sorted(ids)


@pytest.mark.django_db(transaction=True)
def test_prune_intents_prunes_the_named_alias():
    id = Intent.objects.enqueue("webhook", "old", "https://example.com/hook", payload={"a": 1})
    [claimed] = Intent.objects.claim_many(1, kinds=["webhook"])
    long_ago = server_now() - timedelta(days=30)
    assert Intent.objects.complete(id, claimed.claim_token, now=long_ago)
    retention = intents(RETENTION={"completed": {"delete": timedelta(days=7)}})
    with override_settings(**ELSEWHERE, INTENTS=retention):
        out = run("prune_intents", "--database", "default")
    assert out.splitlines() == ["completed: 1 deleted"]
    assert not Intent.objects.exists()


@pytest.mark.django_db
def test_intents_health_reads_the_named_alias():
    Intent.objects.enqueue("webhook", "late", "t", now=server_now() - timedelta(hours=1))
    with override_settings(**ELSEWHERE), pytest.raises(CommandError, match="waited 3600s"):
        run("intents_health", "--max-age", "60", "--database", "default")
    with override_settings(**ELSEWHERE):
        assert "ok" in run("intents_health", "--max-age", "7200", "--database", "default")


@pytest.mark.django_db
def test_the_queue_gauges_read_the_alias_a_pool_names(monkeypatch):
    Intent.objects.enqueue("webhook", "counted", "https://example.com/hook")
    monkeypatch.setattr(QUEUE, "_using", ())
    with override_settings(**ELSEWHERE):
        QUEUE.read_from("default")
        families = {family.name: family for family in QUEUE.collect()}
    assert sum(sample.value for sample in families[PENDING].samples) == 1
