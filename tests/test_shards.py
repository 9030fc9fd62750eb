"""Intents over several databases through Django's routers (issue 41), rows read on each.

Runs only with a second alias, ``shard`` (``INTENTS_TEST_SHARD``, set by
tests/run.py's "shards" suites: PostgreSQL twice, PostgreSQL with SQLite,
SQLite twice, MariaDB twice); the other suites leave this module out (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client import REGISTRY

from django_intents.conf import get_settings, parse
from django_intents.maintenance.schedules import enqueue_due
from django_intents.models import Intent, PausedKind
from django_intents.observability import gauges
from django_intents.observability.gauges import QUEUE
from django_intents.routers import TargetShardRouter
from django_intents.rules.identity import intent_id
from django_intents.rules.shards import shard_of
from django_intents.store import backend_for
from django_intents.store.replicas import replica_lag

from .conftest import T0, external_kinds, intents
from .test_worker_connections import MAX_CONNECTIONS, Sampler
from .test_worker_process import start_worker  # noqa: F401 - the fixture
from .testapp.quiet import HANDLERS as QUIET_HANDLERS
from .workerutil import Worker, wait_for

pytestmark = pytest.mark.django_db(databases=["default", "shard", "replica"], transaction=True)

ALIASES = ["default", "shard"]
SHARDED = "django_intents.routers.TargetShardRouter"
KIND = "webhook"


def where(ids: list[str]) -> dict[str, str]:
    """id -> the alias its row is on; an id on both or on neither fails here."""
    found: dict[str, str] = {}
    for alias in ALIASES:
        for id in Intent.objects.using(alias).filter(id__in=ids).values_list("id", flat=True):  # noqa: A001
            assert id not in found, f"{id} is on both databases"
            found[id] = alias
    assert set(found) == set(ids), f"missing: {set(ids) - set(found)}"
    return found


def counts() -> dict[str, int]:
    return {alias: Intent.objects.using(alias).count() for alias in ALIASES}


@pytest.fixture
def by_target() -> Iterator[None]:
    with override_settings(DATABASE_ROUTERS=[SHARDED], INTENTS=intents(DATABASES=ALIASES)):
        yield


class ByTenant:
    """A project's router: the intent goes to its tenant's database, named in its target."""

    seen: list[dict[str, Any]] = []

    def db_for_write(self, model: type, **hints: Any) -> str | None:
        if model is Intent:
            self.seen.append(hints)
            return "shard" if hints["target"].startswith("tenant-b/") else "default"
        return None


# -- the stable hash ------------------------------------------------------------


def test_a_targets_shard_is_a_digest_of_the_target_that_never_changes():
    # Pinned: a release that changed these would move every target's intents.
    pinned = [shard_of(t, ("a", "b", "c")) for t in ("partner-1", "partner-2", "partner-3")]
    assert pinned == ["a", "b", "a"]
    assert shard_of("partner-2", ["a", "b", "c"]) == "b"  # a list as a tuple
    assert [shard_of(f"https://p{i}.example/hook", ("a", "b")) for i in range(3)] == [
        "a",
        "b",
        "b",
    ]
    spread = Counter(shard_of(f"https://p{i}.example/hook", ("a", "b", "c")) for i in range(3000))
    assert set(spread) == {"a", "b", "c"} and min(spread.values()) > 900, spread
    with pytest.raises(ValueError, match="at least one database alias"):
        shard_of("t", ())


# -- the setting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("default", "must be a list of database aliases"),
        ([], "at least one database alias"),
        (["default", "nowhere"], "must be a database alias .*'nowhere'"),
        (["default", None], "entry None is not a database alias"),
        (["default", "shard", "default"], "lists 'default' more than once"),
    ],
)
def test_a_bad_databases_setting_is_refused_naming_what_is_wrong(value: Any, message: str):
    _, errors = parse({"DATABASES": value})
    assert len(errors) == 1
    assert errors[0].key == "DATABASES"
    assert re.search(message, str(errors[0])), errors[0]


def test_the_databases_setting_keeps_its_order():
    with override_settings(INTENTS=intents(DATABASES=["shard", "default"])):
        assert get_settings().databases == ("shard", "default")


# -- enqueue by target -------------------------------------------------------------


def test_the_target_router_puts_every_intent_of_a_target_on_its_one_database(by_target):
    targets = [f"https://p{i}.example/hook" for i in range(12)]
    ids = {
        target: [Intent.objects.enqueue(KIND, f"e{n}", target, {"n": n}, now=T0) for n in range(3)]
        for target in targets
    }
    for target, target_ids in ids.items():
        assert set(where(target_ids).values()) == {shard_of(target, ALIASES)}, target
    assert set(counts().values()) != {0} and sum(counts().values()) == 36
    assert 0 < counts()["shard"] < 36


def test_an_enqueue_on_a_shard_is_idempotent_there(by_target):
    target = "https://p2.example/hook"
    first = Intent.objects.enqueue(KIND, "e", target, {"v": 1}, now=T0)
    again = Intent.objects.enqueue(KIND, "e", target, {"v": 2}, now=T0)
    assert first == again == intent_id(KIND, "e", target)
    on = shard_of(target, ALIASES)
    assert Intent.objects.using(on).get(pk=first).payload == {"v": 1}
    assert counts() == {alias: int(alias == on) for alias in ALIASES}


def test_each_shard_stamps_an_intent_with_its_own_database_clock(by_target):
    target = "https://p2.example/hook"  # the second database (pinned above)
    id = Intent.objects.enqueue(KIND, "e", target)  # noqa: A001
    row = Intent.objects.using(shard_of(target, ALIASES)).get(pk=id)
    assert row.created_at == row.next_at == row.updated_at
    assert row.created_at > T0


def test_enqueue_many_splits_a_batch_by_shard_and_keeps_the_input_order(by_target):
    items = [
        {"kind": KIND, "event_id": f"e{i}", "target": f"https://p{i % 5}.example/hook"}
        for i in range(20)
    ]
    items.append(dict(items[3]))  # a repeat: the same id, one row
    ids = Intent.objects.enqueue_many(items, now=T0)
    assert ids == [intent_id(i["kind"], i["event_id"], i["target"]) for i in items]
    found = where(ids[:20])
    for item, id in zip(items, ids, strict=True):
        assert found[id] == shard_of(item["target"], ALIASES)
    assert sum(counts().values()) == 20
    rows = Intent.objects.using("shard").order_by("event_id")
    assert {(r.state, r.attempts, r.created_at) for r in rows} == {("pending", 0, T0)}


def test_a_bad_item_in_a_sharded_batch_writes_nothing_anywhere(by_target):
    items = [
        {"kind": KIND, "event_id": f"e{i}", "target": f"https://p{i}.example/hook"}
        for i in range(6)
    ]
    items.append({"kind": KIND, "event_id": "", "target": "https://p9.example/hook"})
    with pytest.raises(ValueError, match=r"items\[6\]: event_id"):
        Intent.objects.enqueue_many(items, now=T0)
    assert counts() == {"default": 0, "shard": 0}


def test_db_manager_names_the_database_whatever_the_router_says(by_target):
    target = "https://p0.example/hook"  # the router's: the first database
    assert shard_of(target, ALIASES) == "default"
    id = Intent.objects.db_manager("shard").enqueue(KIND, "e", target, now=T0)  # noqa: A001
    assert where([id]) == {id: "shard"}


def test_a_router_that_sends_an_intent_outside_the_setting_is_refused_and_nothing_written():
    class Elsewhere:
        def db_for_write(self, model: type, **hints: Any) -> str:
            return "shard"

    with override_settings(DATABASE_ROUTERS=[Elsewhere()], INTENTS=intents(DATABASES=["default"])):
        with pytest.raises(ImproperlyConfigured, match="'shard', which INTENTS\\['DATABASES'\\]"):
            Intent.objects.enqueue(KIND, "e", "t", now=T0)
        with pytest.raises(ImproperlyConfigured, match="does not list"):
            Intent.objects.enqueue_many([{"kind": KIND, "event_id": "e", "target": "t"}], now=T0)
    assert counts() == {"default": 0, "shard": 0}


def test_the_target_router_without_the_setting_says_what_it_needs():
    needs = pytest.raises(ImproperlyConfigured, match="needs INTENTS\\['DATABASES'\\]")
    with override_settings(DATABASE_ROUTERS=[SHARDED]), needs:
        Intent.objects.enqueue(KIND, "e", "t", now=T0)
    assert counts() == {"default": 0, "shard": 0}


# -- a project's own router: the outbox, by tenant -----------------------------------


def test_a_tenant_router_gets_kind_target_and_id_and_the_intent_joins_the_tenants_transaction():
    ByTenant.seen.clear()
    with override_settings(DATABASE_ROUTERS=[ByTenant()], INTENTS=intents(DATABASES=ALIASES)):
        with transaction.atomic(using="shard"):
            id = Intent.objects.enqueue(KIND, "order-1", "tenant-b/hook", now=T0)  # noqa: A001
            assert Intent.objects.using("shard").filter(pk=id).exists()
            transaction.set_rollback(True, using="shard")  # the business change failed
        assert counts() == {"default": 0, "shard": 0}
        with transaction.atomic(using="shard"):
            kept = Intent.objects.enqueue(KIND, "order-1", "tenant-b/hook", now=T0)
        other = Intent.objects.enqueue(KIND, "order-2", "tenant-a/hook", now=T0)
    assert ByTenant.seen[0] == {"kind": KIND, "target": "tenant-b/hook", "id": id}
    assert where([kept, other]) == {kept: "shard", other: "default"}


def test_the_target_router_migrates_the_app_on_the_listed_databases_only():
    with override_settings(INTENTS=intents(DATABASES=["shard"])):
        router = TargetShardRouter()
        assert router.allow_migrate("shard", "django_intents") is True
        assert router.allow_migrate("default", "django_intents") is False
        assert router.allow_migrate("default", "auth") is None


def test_the_check_fails_a_target_router_without_the_databases_setting():
    with override_settings(DATABASE_ROUTERS=[SHARDED]):
        found = [m for m in run_checks() if m.id == "django_intents.E012"]
        assert len(found) == 1 and "INTENTS['DATABASES'] is not set" in found[0].msg
    with override_settings(DATABASE_ROUTERS=[SHARDED], INTENTS=intents(DATABASES=ALIASES)):
        assert not [m for m in run_checks() if m.id == "django_intents.E012"]


# -- one worker process, several databases -------------------------------------------


def enqueue_on(alias: str, kind: str, n: int, **payload: Any) -> list[str]:
    manager = Intent.objects.db_manager(alias)
    return [manager.enqueue(kind, f"{alias}-{i}", f"t{i}", payload) for i in range(n)]


def states_on(alias: str, ids: list[str]) -> Counter[tuple[str, int]]:
    rows = Intent.objects.using(alias).filter(id__in=ids)
    return Counter((r.state, r.attempts) for r in rows)


def test_one_process_drains_every_database_it_is_given(start_worker):  # noqa: F811 - the fixture
    ids = {alias: enqueue_on(alias, "test.ok", 25) for alias in ALIASES}
    worker = start_worker("--drain", "--database", "default", "--database", "shard")
    worker.assert_clean_exit(timeout=60)
    for alias in ALIASES:
        assert states_on(alias, ids[alias]) == {("completed", 1): 25}, alias
    assert "database default:" in worker.log and "database shard:" in worker.log


def test_all_databases_serves_the_setting_and_without_it_claims_nothing(start_worker):  # noqa: F811 - the fixture
    ids = {alias: enqueue_on(alias, "test.ok", 5) for alias in ALIASES}
    refused = start_worker("--drain", "--all-databases")
    assert refused.wait(60) != 0
    assert "INTENTS['DATABASES'], which is not set" in refused.log
    for alias in ALIASES:
        assert states_on(alias, ids[alias]) == {("pending", 0): 5}, alias
    served = start_worker("--drain", "--all-databases", intents={"DATABASES": ALIASES})
    served.assert_clean_exit(timeout=60)
    for alias in ALIASES:
        assert states_on(alias, ids[alias]) == {("completed", 1): 5}, alias


def test_an_unknown_database_is_refused_before_anything_is_claimed(start_worker):  # noqa: F811 - the fixture
    ids = enqueue_on("default", "test.ok", 3)
    worker = start_worker("--drain", "--database", "default", "--database", "nowhere")
    assert worker.wait(60) != 0
    assert "unknown database alias 'nowhere'" in worker.log
    assert states_on("default", ids) == {("pending", 0): 3}


def test_a_signal_stops_every_databases_pool_and_gives_back_their_claims(start_worker):  # noqa: F811 - the fixture
    ids = {alias: enqueue_on(alias, "test.sleepy", 2, on_cancel="ignore") for alias in ALIASES}
    worker = start_worker(
        "--database", "default", "--database", "shard", "--workers", "1", "--grace", "0.5"
    )
    for alias in ALIASES:
        wait_for(
            lambda alias=alias: states_on(alias, ids[alias])[("running", 1)] == 1,
            f"an attempt running on {alias}",
            timeout=30,
        )
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=20)
    for alias in ALIASES:
        # The running one released after the grace period; the other never claimed,
        # or claimed and given back unstarted: pending either way, nothing lost.
        rows = Intent.objects.using(alias).filter(id__in=ids[alias])
        assert {r.state for r in rows} == {"pending"}, alias
        assert {r.claim_token for r in rows} == {""}, alias


def test_a_deep_backlog_on_one_database_does_not_hold_back_another(start_worker):  # noqa: F811 - the fixture
    deep = enqueue_on("default", "test.sleepy", 120, seconds=0.05)
    shallow = enqueue_on("shard", "test.sleepy", 5, seconds=0.05)
    worker = start_worker("--database", "default", "--database", "shard", "--workers", "2")
    wait_for(
        lambda: states_on("shard", shallow) == {("completed", 1): 5},
        "the shallow database's intents",
        timeout=30,
    )
    left = Intent.objects.using("default").filter(id__in=deep, state="pending").count()
    assert left > 60, left  # the deep one is far from done: the shallow one did not wait
    worker.signal(signal.SIGTERM)
    worker.assert_clean_exit(timeout=20)
    assert sum(states_on("default", deep).values()) == 120


def test_an_outage_of_one_database_stops_the_others_pools_and_exits_non_zero(start_worker):  # noqa: F811 - the fixture
    ids = enqueue_on("default", "test.ok", 5)
    worker = start_worker(
        "--database", "default", "--database", "shard", "--db-error-timeout", "1.5",
        INTENTS_TEST_UNREACHABLE="shard",
    )  # fmt: skip
    # Not a drain: only the shard's outage can end the process, and the default
    # database's pool, which works meanwhile, must be stopped by it.
    code = worker.wait(30)
    assert code != 0, worker.log
    assert "database shard: its pool ended with status 1" in worker.log
    assert "stopping the pools of the other databases" in worker.log
    rows = Intent.objects.using("default").filter(id__in=ids)
    assert {(r.state, r.claim_token) for r in rows} <= {("completed", ""), ("pending", "")}
    assert rows.count() == 5
    assert Intent.objects.using("shard").count() == 0


def test_a_schedule_is_enqueued_once_in_the_fleet_on_its_targets_database():
    schedule = {"cron": "* * * * *", "kind": KIND, "target": "https://p2.example/hook"}
    home = shard_of(schedule["target"], ALIASES)
    with override_settings(
        DATABASE_ROUTERS=[SHARDED], INTENTS=intents(DATABASES=ALIASES, SCHEDULES={"s": schedule})
    ):
        rounds = []
        for _ in range(2):  # two pools of each database, one tick each
            returned = [enqueue_due(now=T0, using=alias) for alias in ALIASES]
            rounds.append(counts())
    assert rounds[0] == rounds[1]  # the second round found every slot there
    assert rounds[0][home] >= 1 and sum(rounds[0].values()) == rounds[0][home], rounds
    assert returned[ALIASES.index(home)] and not returned[1 - ALIASES.index(home)]
    assert {r.target for r in Intent.objects.using(home)} == {schedule["target"]}


# -- the other commands, across databases --------------------------------------------


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_health_checks_every_database_and_names_the_one_that_is_stuck():
    Intent.objects.db_manager("default").enqueue(KIND, "fresh", "t")
    Intent.objects.db_manager("shard").enqueue(KIND, "old", "t", next_at=T0)  # waited long
    with override_settings(INTENTS=intents(DATABASES=ALIASES)):
        with pytest.raises(CommandError, match=r"^database shard: stuck: .*'webhook'") as failed:
            command("intents_health", "--all-databases", "--max-age", "60")
        assert failed.value.returncode == 1
        assert "database default" not in str(failed.value)
        out = command("intents_health", "--database", "default", "--max-age", "60")
    assert out.startswith("ok: ")


def test_prune_prunes_each_database_it_is_given():
    ids = {}
    for alias in ALIASES:
        manager = Intent.objects.db_manager(alias)
        ids[alias] = manager.enqueue(KIND, "done", "t", now=T0)
        manager.filter(pk=ids[alias]).update(state="completed", updated_at=T0)
    retention = {"completed": {"delete": timedelta(days=1)}}
    with override_settings(INTENTS=intents(RETENTION=retention)):
        out = command("prune_intents", "--database", "default", "--database", "shard")
    assert out.count("completed: 1 deleted") == 2
    assert out.index("database default:") < out.index("database shard:")
    assert counts() == {"default": 0, "shard": 0}


def test_the_schedules_each_database_holds_are_listed_under_it():
    schedules = {
        "a": {"cron": "0 * * * *", "kind": KIND, "target": "https://p0.example/hook"},
        "b": {"cron": "0 * * * *", "kind": KIND, "target": "https://p2.example/hook"},
    }
    assert [shard_of(s["target"], ALIASES) for s in schedules.values()] == ["default", "shard"]
    with override_settings(
        DATABASE_ROUTERS=[SHARDED], INTENTS=intents(DATABASES=ALIASES, SCHEDULES=schedules)
    ):
        out = command("intents_schedules", "--all-databases")
    default, shard = out.split("database shard:\n")
    assert default.startswith("database default:\n")
    assert [line.split("\t")[0] for line in default.splitlines()[1:]] == ["a"]
    assert [line.split("\t")[0] for line in shard.splitlines()] == ["b"]


# -- the admin, on one database at a time --------------------------------------------

CHANGELIST = "admin:django_intents_intent_changelist"


def url(name: str, *args: str) -> str:
    return reverse(name, args=args)


@pytest.fixture
def two_databases() -> Iterator[dict[str, str]]:
    """One intent on each database, the admin told of both."""
    with override_settings(INTENTS=intents(DATABASES=ALIASES)):
        yield {
            alias: Intent.objects.db_manager(alias).enqueue(KIND, f"on-{alias}", "t", now=T0)
            for alias in ALIASES
        }


def switch(client: Any, alias: str, back: str = "") -> Any:
    data = {"database": alias, "next": back or url(CHANGELIST)}
    return client.post(url("admin:django_intents_intent_database"), data)


def test_the_admin_lists_the_chosen_databases_intents_and_says_which(admin_client, two_databases):
    first = admin_client.get(url(CHANGELIST)).content.decode()
    assert 'data-database="default"' in first and '<option value="shard">' in first
    assert two_databases["default"][:12] in first and two_databases["shard"][:12] not in first
    response = switch(admin_client, "shard")
    assert response.status_code == 302 and response["Location"] == url(CHANGELIST)
    then = admin_client.get(url(CHANGELIST)).content.decode()
    assert 'data-database="shard"' in then and '<option value="default">' in then
    assert two_databases["shard"][:12] in then and two_databases["default"][:12] not in then
    page = admin_client.get(url("admin:django_intents_intent_change", two_databases["shard"]))
    assert page.status_code == 200 and 'data-database="shard"' in page.content.decode()


def test_a_button_changes_the_intent_on_the_database_shown(admin_client, two_databases):
    switch(admin_client, "shard")
    shard_id = two_databases["shard"]
    cancel = url("admin:django_intents_intent_cancel", shard_id)
    response = admin_client.post(cancel, {"post": "yes"})
    assert response.status_code == 302
    assert Intent.objects.using("shard").get(pk=shard_id).state == "cancelled"
    assert Intent.objects.using("default").get(pk=two_databases["default"]).state == "pending"
    # The list acts on the database shown: an id of the other one is not touched there.
    admin_client.post(
        url(CHANGELIST),
        {"action": "cancel", "_selected_action": [two_databases["default"]], "post": "yes"},
    )
    assert Intent.objects.using("default").get(pk=two_databases["default"]).state == "pending"
    # And pausing a kind pauses it on the database shown.
    admin_client.post(url("admin:django_intents_intent_pause"), {"kind": KIND})
    assert [p.kind for p in PausedKind.objects.using("shard")] == [KIND]
    assert not PausedKind.objects.using("default").exists()


def test_the_dashboard_and_the_targets_page_read_the_database_shown(admin_client, two_databases):
    switch(admin_client, "shard")
    for name in ("dashboard", "targets"):
        page = admin_client.get(url(f"admin:django_intents_intent_{name}"))
        assert page.status_code == 200, name
        assert 'data-database="shard"' in page.content.decode(), name


def test_a_database_the_setting_does_not_list_is_refused_and_the_choice_kept(
    admin_client, two_databases
):
    switch(admin_client, "shard")
    response = switch(admin_client, "elsewhere")
    assert response.status_code == 302
    listed = admin_client.get(url(CHANGELIST), follow=True).content.decode()
    assert "not one of the queue" in listed and 'data-database="shard"' in listed


def test_the_switch_goes_back_only_to_this_site(admin_client, two_databases):
    response = switch(admin_client, "shard", back="https://evil.example/")
    assert response["Location"] == url(CHANGELIST)


def test_with_one_database_the_admin_offers_no_switch(admin_client):
    Intent.objects.enqueue(KIND, "one", "t", now=T0)
    page = admin_client.get(url(CHANGELIST)).content.decode()
    assert "intents-database" not in page


# -- metrics, per database ---------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_transition_is_counted_under_the_database_it_happened_on():
    moved = "django_intents_transitions_total"
    before = {a: sample(moved, kind=KIND, to="pending", database=a) for a in ALIASES}
    Intent.objects.db_manager("shard").enqueue_many(
        [{"kind": KIND, "event_id": f"e{i}", "target": "t"} for i in range(3)], now=T0
    )
    Intent.objects.db_manager("default").enqueue(KIND, "one", "t", now=T0)
    after = {a: sample(moved, kind=KIND, to="pending", database=a) for a in ALIASES}
    assert {a: after[a] - before[a] for a in ALIASES} == {"default": 1, "shard": 3}


def pending_gauge() -> dict[str, float]:
    """The pending gauge of ``KIND`` per database, read afresh."""
    QUEUE.invalidate()
    families = {family.name: family for family in QUEUE.collect()}
    return {
        s.labels["database"]: s.value
        for s in families["django_intents_pending"].samples
        if s.labels["kind"] == KIND
    }


def test_the_gauges_read_every_database_of_the_queue():
    enqueue_on("default", KIND, 2)
    enqueue_on("shard", KIND, 5)
    with override_settings(INTENTS=intents(DATABASES=ALIASES)):
        pending = pending_gauge()
    assert pending == {"default": 2, "shard": 5}


def test_a_database_the_gauges_cannot_read_leaves_out_only_its_own_series(monkeypatch):
    enqueue_on("default", KIND, 2)
    real = gauges.read_backlog

    def failing(*args: Any, using: str, **kwargs: Any) -> Any:
        if using == "shard":
            raise DatabaseError("the shard is down")
        return real(*args, using=using, **kwargs)

    monkeypatch.setattr(gauges, "read_backlog", failing)
    with override_settings(INTENTS=intents(DATABASES=ALIASES)):
        QUEUE.invalidate()
        families = {family.name: family for family in QUEUE.collect()}
    databases = {s.labels["database"] for s in families["django_intents_pending"].samples}
    assert databases == {"default"}
    QUEUE.invalidate()


# -- read replicas -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("databases", "value", "message"),
    [
        (None, "nowhere", "must be a database alias"),
        (None, {"default": "nowhere"}, "must be a database alias"),
        (None, [], "must be a database alias or a dict"),
        (ALIASES, "replica", "names one replica, but DATABASES lists several"),
        (["default"], {"shard": "replica"}, "maps 'shard', not in DATABASES"),
    ],
)
def test_a_bad_read_database_is_refused_naming_what_is_wrong(databases, value, message):
    raw = {"READ_DATABASE": value} if databases is None else {"DATABASES": databases}
    raw["READ_DATABASE"] = value
    _, errors = parse(raw)
    assert [e.key for e in errors] == ["READ_DATABASE"]
    assert message in str(errors[0]), errors[0]


def test_the_read_database_maps_each_queue_database_to_its_replica():
    with override_settings(INTENTS=intents(READ_DATABASE="replica")):
        assert get_settings().read_alias("default") == "replica"
    mapped = intents(DATABASES=ALIASES, READ_DATABASE={"default": "replica"})
    with override_settings(INTENTS=mapped):
        assert get_settings().read_alias("default") == "replica"
        assert get_settings().read_alias("shard") == "shard"


def test_the_admins_counts_read_the_replica_and_say_how_stale_they_may_be(admin_client):
    enqueue_on("default", KIND, 3)
    with (
        override_settings(INTENTS=intents(READ_DATABASE="replica")),
        CaptureQueriesContext(connections["replica"]) as on_replica,
        CaptureQueriesContext(connections["default"]) as on_primary,
    ):
        page = admin_client.get(url(CHANGELIST)).content.decode()
    # A test's "replica" is the primary itself: it says it is not replaying.
    assert 'data-replica="replica"' in page and "not replaying" in page
    assert any("count" in q["sql"].lower() for q in on_replica.captured_queries)
    # The summary's counts and the list's count came from the replica; the rows did not.
    assert not any("claim_token" in q["sql"] for q in on_replica.captured_queries)
    assert any("claim_token" in q["sql"] for q in on_primary.captured_queries)


def test_the_gauges_read_the_replica_and_keep_the_queues_database_label():
    enqueue_on("default", KIND, 4)
    with (
        override_settings(INTENTS=intents(READ_DATABASE="replica")),
        CaptureQueriesContext(connections["replica"]) as on_replica,
    ):
        pending = pending_gauge()
    assert pending == {"default": 4}
    assert on_replica.captured_queries, "the gauges read the primary"
    QUEUE.invalidate()


def test_a_replica_that_replays_nothing_says_so():
    assert replica_lag(backend_for(connections["replica"], Intent)).replaying is False


# -- connections: the bound of one pool, per database ------------------------------------


def connections_to(alias: str) -> Callable[[int], int]:
    """Count a worker's connections to ``alias`` as its server sees them (PostgreSQL),
    or as the worker's open descriptors on its file (SQLite)."""
    settings = connections[alias].settings_dict
    if connections[alias].vendor == "sqlite":
        return lambda pid: sqlite_count_of(settings["NAME"], pid)
    sql = {
        "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
        "AND pid <> pg_backend_pid()",
        "mysql": "SELECT count(*) FROM information_schema.processlist "
        "WHERE db = %s AND id <> CONNECTION_ID()",
    }[connections[alias].vendor]

    def count(pid: int) -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, [settings["NAME"]])
            return int(cursor.fetchone()[0])

    return count


def sqlite_count_of(name: str, pid: int) -> int:
    database, opened = os.path.realpath(name), 0
    try:
        entries = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:
        return 0
    for fd in entries:
        with contextlib.suppress(OSError):
            opened += os.readlink(fd) == database
    return opened


def test_each_database_gets_one_pools_bound_of_connections_and_no_more():
    with external_kinds(*QUIET_HANDLERS):
        for alias in ALIASES:
            Intent.objects.db_manager(alias).enqueue_many(
                {"kind": "test.quiet", "event_id": f"e{n}", "target": "t"} for n in range(600)
            )
    for alias in ALIASES:
        connections[alias].close()
    settings = {"HANDLERS": QUIET_HANDLERS, "MAX_ATTEMPTS": 1}
    args = ["--drain", "--database", "default", "--database", "shard", "--workers", "64"]
    worker = Worker([*args, "--kinds", "test.quiet"], settings, {})
    try:
        samplers = {alias: Sampler(connections_to(alias), worker.proc.pid) for alias in ALIASES}
        code = worker.wait(90)
        samples = {alias: sampler.stop() for alias, sampler in samplers.items()}
    finally:
        worker.cleanup()
    assert code == 0, worker.log[-2000:]
    for alias in ALIASES:
        # Counted (at least the pool's own connection was seen), and within one pool's bound.
        assert 1 <= max(samples[alias]) <= MAX_CONNECTIONS, (alias, samples[alias])
        rows = Intent.objects.using(alias).filter(kind="test.quiet")
        assert list(rows.order_by().values_list("state", "attempts").distinct()) == [
            ("completed", 1)
        ]


def test_a_targets_limit_is_exact_on_its_one_database(by_target):
    """Every intent of a target on one database: its per-target limit counts them all."""
    limited = intents(DATABASES=ALIASES, LIMITS={KIND: {"per_target": 2}})
    targets = ["https://p0.example/hook", "https://p2.example/hook"]  # default, shard
    with override_settings(INTENTS=limited):
        for target in targets:
            for n in range(5):
                Intent.objects.enqueue(KIND, f"e{n}", target, now=T0)
        claimed = {
            alias: [i.target for i in Intent.objects.db_manager(alias).claim_many(10, now=T0)]
            for alias in ALIASES
        }
        again = {
            alias: Intent.objects.db_manager(alias).claim_many(10, now=T0) for alias in ALIASES
        }
    assert claimed == {"default": [targets[0]] * 2, "shard": [targets[1]] * 2}
    assert again == {"default": [], "shard": []}  # two running of each: the limit holds


# -- LISTEN behind a pooler, several databases -------------------------------------------


def test_listen_database_maps_each_queue_database_to_the_alias_it_listens_on():
    _, errors = parse({"LISTEN_DATABASE": {"default": "nowhere"}})
    assert [e.key for e in errors] == ["LISTEN_DATABASE"] and "'nowhere'" in str(errors[0])
    with override_settings(INTENTS=intents(LISTEN_DATABASE={"default": "replica"})):
        assert get_settings().listen_alias("default") == "replica"
        assert get_settings().listen_alias("shard") == "shard"
    with override_settings(INTENTS=intents(LISTEN_DATABASE="replica")):
        assert get_settings().listen_alias("shard") == "replica"


def test_one_listen_database_for_several_databases_is_refused_before_any_claim(start_worker):  # noqa: F811 - the fixture
    ids = enqueue_on("shard", "test.ok", 2)
    refused = start_worker(
        "--drain", "--database", "default", "--database", "shard",
        intents={"LISTEN_DATABASE": "replica"},
    )  # fmt: skip
    assert refused.wait(60) != 0
    assert "make it a dict of queue alias" in refused.log
    assert states_on("shard", ids) == {("pending", 0): 2}
    mapped = start_worker(
        "--drain", "--database", "default", "--database", "shard",
        intents={"LISTEN_DATABASE": {"default": "replica"}},
    )  # fmt: skip
    mapped.assert_clean_exit(timeout=60)
    assert states_on("shard", ids) == {("completed", 1): 2}


def test_pause_and_resume_act_on_every_database_they_are_given():
    out = command("intents_pause", KIND, "--database", "default", "--database", "shard")
    assert out.splitlines() == [
        f"{KIND}: paused (database default)",
        f"{KIND}: paused (database shard)",
    ]
    assert [p.kind for a in ALIASES for p in PausedKind.objects.using(a)] == [KIND, KIND]
    with override_settings(INTENTS=intents(DATABASES=ALIASES)):
        command("intents_resume", KIND, "--all-databases")
    assert not any(PausedKind.objects.using(a).exists() for a in ALIASES)


def test_a_bad_kind_pauses_nothing_on_any_database():
    with pytest.raises(CommandError, match="nothing was changed"):
        command("intents_pause", KIND, "", "--database", "default", "--database", "shard")
    assert not any(PausedKind.objects.using(a).exists() for a in ALIASES)


def test_redrive_redrives_the_cancelled_intents_of_each_database():
    ids = {alias: enqueue_on(alias, KIND, 2) for alias in ALIASES}
    for alias in ALIASES:
        Intent.objects.db_manager(alias).cancel_many(dict.fromkeys(ids[alias], KIND))
    out = command("intents_redrive", "--database", "default", "--database", "shard")
    assert out.index("database default:") < out.index("database shard:")
    for alias in ALIASES:
        assert states_on(alias, ids[alias]) == {("pending", 0): 2}, alias
