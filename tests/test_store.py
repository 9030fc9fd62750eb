"""The store's conformance suite: the same tests against the backend of the database
the suite runs on (``INTENTS_TEST_DB``), as River's driver tests run against every driver.

Each test calls the backend (``store.backend_for``) directly, drives time
through ``now=``, and reads the rows afterwards through the ORM. What a
database does its own way (MariaDB's lack of ``RETURNING``, PostgreSQL's
claim in one statement) must not show here.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta

import pytest
from django.db import connection

from django_intents.models import Intent
from django_intents.rules.limits import Limit
from django_intents.rules.states import CLAIM_ORDER, State, due
from django_intents.rules.targets import BLOCKING, TargetHealth
from django_intents.rules.validation import new_row
from django_intents.store import ClaimFilters, backend_for
from django_intents.store.base import Backend, Ending
from django_intents.store.claims import claim_order
from django_intents.store.replicas import Lag, replica_lag
from django_intents.store.statements import SQL, bind, spread, vendor_names

from .conftest import T0, at

pytestmark = pytest.mark.django_db

EVERY = ClaimFilters()


def store() -> Backend:
    return backend_for(connection, Intent)


def insert(
    *events: str, kind: str = "webhook", next_at: float = 0, priority: int = 0, target: str = "t"
) -> list[str]:
    """New intents written by the store itself, due at ``next_at``; their ids."""
    rows = [
        new_row(kind, event, target, {"e": event}, at(next_at), None, T0, priority=priority)
        for event in events
    ]
    store().insert(rows)
    return [str(row["id"]) for row in rows]


def claim(
    limit: int = 10, now: float = 1, lease: float = 30, filters: ClaimFilters = EVERY
) -> list[tuple[Intent, datetime | None]]:
    return list(store().claim(now=at(now), until=at(now + lease), limit=limit, filters=filters))


def claimed_ids(**kwargs: object) -> list[str]:
    return [intent.id for intent, _ in claim(**kwargs)]  # type: ignore[arg-type]


def row(id: str) -> Intent:  # noqa: A002
    return Intent.objects.get(pk=id)


def states(*ids: str) -> list[str]:
    return [row(id).state for id in ids]


# -- insert ----------------------------------------------------------------------


def test_insert_returns_the_kind_of_each_row_written_and_leaves_known_ids_alone():
    [first] = insert("a", kind="push")
    rows = [
        new_row("push", "a", "t", {"other": 1}, at(5), None, at(1)),  # the same id: kept
        new_row("webhook", "b", "t", {}, at(5), None, at(1)),
    ]
    assert store().insert(rows) == ["webhook"]
    kept = row(first)
    assert (kept.payload, kept.next_at, kept.created_at) == ({"e": "a"}, at(0), T0)
    assert Intent.objects.count() == 2


# -- claim -----------------------------------------------------------------------


def test_claim_takes_due_intents_in_claim_order_higher_priority_first():
    late, early = insert("late", next_at=-5), insert("early", next_at=-10)
    high = insert("high", next_at=-1, priority=5)
    low = insert("low", next_at=-20, priority=-5)
    insert("later", next_at=100)
    taken = claim(limit=10)
    assert [intent.id for intent, _ in taken] == [*high, *early, *late, *low]
    for intent, lease_end in taken:
        assert lease_end is None
        stored = row(intent.id)
        assert (stored.state, stored.attempts, stored.claim_until) == ("running", 1, at(31))
        assert stored.claim_token == intent.claim_token and len(intent.claim_token) == 32
        assert (intent.state, intent.attempts, intent.claim_until) == ("running", 1, at(31))
    assert len({intent.claim_token for intent, _ in taken}) == 4


def test_a_claimed_intent_holds_every_field_as_the_orm_reads_it_times_aware():
    [id] = insert("fields", next_at=-3)
    [(intent, _)] = claim(limit=1)
    stored = row(id)
    for field in Intent._meta.concrete_fields:
        if field.attname == "updated_at":  # the claim's now, which the store does not return
            continue
        assert getattr(intent, field.attname) == getattr(stored, field.attname), field.attname
    for name in ("created_at", "next_at", "claim_until"):
        value = getattr(intent, name)
        assert value.utcoffset() == timedelta(0) and value == getattr(stored, name), name


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-06 06:08:00.123456",
        "2026-12-06 06:08:00",
        "2026-12-06T06:08:00+02:00",
        "2026-12-06 06:08:00.5",
        None,
    ],
)
@pytest.mark.parametrize("use_tz", [True, False])
def test_the_sqlite_time_converter_reads_what_djangos_reads(text, use_tz, settings):
    from django.db.backends.sqlite3.base import DatabaseOperations

    from django_intents.store.rows import _text_times

    settings.USE_TZ = use_tz
    sqlite = type("Conn", (), {"vendor": "sqlite", "timezone": connection.timezone})()
    django_s = DatabaseOperations(sqlite).convert_datetimefield_value
    fast = _text_times(sqlite, django_s)
    assert fast is not django_s
    assert fast(text, None, sqlite) == django_s(text, None, sqlite)
    if text is not None:
        assert fast(text, None, sqlite).tzinfo == django_s(text, None, sqlite).tzinfo


def test_claim_takes_no_more_than_its_limit_and_leaves_the_rest_in_place():
    ids = insert(*[f"e{i}" for i in range(5)])
    first = claimed_ids(limit=2)
    assert len(first) == 2
    assert states(*ids).count("pending") == 3
    assert set(claimed_ids(limit=10)) == set(ids) - set(first)
    assert claimed_ids(limit=10) == []


def test_claim_takes_over_an_expired_lease_and_says_when_it_ended():
    [id] = insert("a")
    [(_, none)] = claim(now=1, lease=10)
    assert none is None
    old = row(id).claim_token
    assert claim(now=5) == []  # the lease is live until 11
    [(intent, lease_end)] = claim(now=11, lease=10)
    assert (intent.id, lease_end) == (id, at(11))
    stored = row(id)
    assert (stored.attempts, stored.claim_until) == (2, at(21))
    assert stored.claim_token not in ("", old)


def test_claim_of_some_kinds_leaves_the_others():
    [push] = insert("a", kind="push")
    insert("b", kind="webhook")
    assert claimed_ids(filters=ClaimFilters(kinds=["push", "nope"])) == [push]


def test_claim_floor_leaves_out_intents_due_before_it_at_priority_zero_only():
    [old] = insert("old", next_at=-10)
    [new] = insert("new", next_at=-1)
    [urgent] = insert("urgent", next_at=-10, priority=3)
    assert claimed_ids(filters=ClaimFilters(since=at(-5))) == [urgent, new]
    assert states(old) == ["pending"]


def test_claim_leaves_out_expired_leases_that_used_the_last_attempt():
    [id] = insert("a")
    claim(now=1, lease=5)
    assert claimed_ids(now=10, filters=ClaimFilters(max_attempts=1)) == []
    assert claimed_ids(now=10, filters=ClaimFilters(max_attempts=2)) == [id]


def test_claim_leaves_out_paused_kinds_and_so_does_the_due_probe():
    insert("a", kind="push")
    [hook] = insert("b", kind="webhook")
    backend = store()
    assert backend.pause("push", now=T0) is True
    assert backend.pause("push", now=T0) is False
    assert backend.paused() == {"push"}
    assert backend.has_due(now=at(1), filters=ClaimFilters(kinds=["push"])) is False
    assert claimed_ids() == [hook]
    assert backend.resume("push") is True
    assert backend.resume("push") is False
    assert backend.has_due(now=at(1), filters=ClaimFilters(kinds=["push"])) is True


def test_due_probe_sees_what_a_claim_would_take():
    insert("a", next_at=10)
    backend = store()
    assert backend.has_due(now=at(9), filters=EVERY) is False
    assert backend.has_due(now=at(10), filters=EVERY) is True
    claim(now=10, lease=5)
    assert backend.has_due(now=at(14), filters=EVERY) is False
    assert backend.has_due(now=at(15), filters=EVERY) is True


def test_a_limited_claim_takes_no_more_than_a_target_has_room_for():
    insert("a1", "a2", "a3", target="a")
    insert("b1", target="b")
    limits = {"webhook": Limit(per_target=2)}
    taken = [intent for intent, _ in claim(filters=ClaimFilters(limits=limits))]
    assert sorted(intent.target for intent in taken) == ["a", "a", "b"]
    assert claim(filters=ClaimFilters(limits=limits)) == []


# -- fenced transitions ------------------------------------------------------------


@pytest.fixture
def held() -> tuple[str, str]:
    """One intent, claimed at 1 with a lease to 31: its id and token."""
    [id] = insert("a")
    [(intent, _)] = claim(now=1)
    return id, intent.claim_token


STALE = "0" * 32


def test_renew_moves_the_lease_of_a_held_claim_only(held):
    id, token = held
    backend = store()
    assert backend.renew(id, STALE, now=at(2), until=at(90)) is False
    assert backend.renew(id, token, now=at(2), until=at(60)) is True
    stored = row(id)
    assert (stored.claim_until, stored.updated_at) == (at(60), at(2))


def test_complete_is_fenced_by_the_token_and_clears_the_claim(held):
    id, token = held
    backend = store()
    assert backend.complete(id, STALE, now=at(2)) == []
    assert states(id) == ["running"]
    assert backend.complete(id, token, now=at(2)) == ["webhook"]
    stored = row(id)
    assert (stored.state, stored.claim_token, stored.claim_until) == ("completed", "", None)
    assert backend.complete(id, token, now=at(3)) == []


def test_retry_is_fenced_and_sets_the_next_attempt_and_the_error(held):
    id, token = held
    backend = store()
    assert backend.retry(id, STALE, now=at(2), next_at=at(50), error="no") == []
    assert backend.attempts(id, token) == 1
    assert backend.retry(id, token, now=at(2), next_at=at(50), error="boom") == ["webhook"]
    stored = row(id)
    assert (stored.state, stored.next_at, stored.last_error) == ("pending", at(50), "boom")
    assert (stored.claim_token, stored.claim_until) == ("", None)
    assert backend.attempts(id, token) is None


def test_cancel_claim_and_release_are_fenced(held):
    id, token = held
    backend = store()
    assert backend.release(id, STALE, now=at(2)) == []
    assert backend.release(id, token, now=at(2)) == ["webhook"]
    stored = row(id)
    assert (stored.state, stored.next_at, stored.claim_token) == ("pending", at(2), "")
    [(intent, _)] = claim(now=3)
    assert backend.cancel_claim(id, token, now=at(4), error="x") == []  # the old token
    assert backend.cancel_claim(id, intent.claim_token, now=at(4), error="gone") == ["webhook"]
    stored = row(id)
    assert (stored.state, stored.last_error, stored.claim_until) == ("cancelled", "gone", None)


def test_a_claim_taken_over_after_its_lease_expired_no_longer_holds(held):
    id, token = held
    [(intent, _)] = claim(now=40)
    backend = store()
    assert backend.complete(id, token, now=at(41)) == []
    assert backend.complete(id, intent.claim_token, now=at(41)) == ["webhook"]


# -- batches --------------------------------------------------------------------


def test_complete_many_completes_the_held_claims_and_skips_stale_tokens():
    a, b, c = insert("a", "b", "c")
    tokens = {intent.id: intent.claim_token for intent, _ in claim(now=1)}
    backend = store()
    done = backend.complete_many([(a, tokens[a]), (b, STALE), (c, tokens[c])], now=at(2))
    assert sorted(done) == sorted([(a, "webhook"), (c, "webhook")])
    assert states(a, b, c) == ["completed", "running", "completed"]


def test_finish_many_applies_each_ending_fenced_by_its_token():
    a, b, c, d = insert("a", "b", "c", "d")
    tokens = {intent.id: intent.claim_token for intent, _ in claim(now=1)}
    endings = [
        Ending(a, tokens[a], "pending", next_at=at(60), error="later", snooze=True),
        Ending(b, tokens[b], "cancelled", error="gave up"),
        Ending(c, tokens[c], "pending", next_at=at(2), unstarted=True),
        Ending(d, STALE, "cancelled"),
    ]
    finished = store().finish_many(endings, now=at(2))
    assert sorted(finished) == sorted(
        [(a, "webhook", "pending"), (b, "webhook", "cancelled"), (c, "webhook", "pending")]
    )
    ra, rb, rc, rd = (row(id) for id in (a, b, c, d))
    assert (ra.state, ra.next_at, ra.last_error, ra.snoozes, ra.attempts) == (
        "pending",
        at(60),
        "later",
        1,
        1,
    )
    assert (rb.state, rb.last_error, rb.claim_token) == ("cancelled", "gave up", "")
    assert (rc.state, rc.next_at, rc.attempts, rc.last_error) == ("pending", at(2), 0, "")
    assert (rd.state, rd.claim_token) == ("running", tokens[d])


def test_cancel_exhausted_cancels_only_expired_leases_that_used_their_last_attempt():
    a, b = insert("a", "b")
    [c] = insert("c", kind="push")
    assert len(claim(now=1, lease=5)) == 3
    backend = store()
    assert backend.cancel_exhausted(now=at(3), max_attempts=1, kinds=None, error="e") == []
    kinds = backend.cancel_exhausted(now=at(10), max_attempts=1, kinds=["webhook"], error="tired")
    assert sorted(kinds) == ["webhook", "webhook"]
    assert states(a, b, c) == ["cancelled", "cancelled", "running"]
    assert row(a).last_error == "tired"
    assert backend.cancel_exhausted(now=at(10), max_attempts=2, kinds=None, error="e") == []


# -- unfenced transitions -----------------------------------------------------------


def test_the_administrative_transitions_move_unfinished_intents_only():
    a, b = insert("a", "b", next_at=100)
    backend = store()
    assert backend.retry_now(a, now=at(5)) == ["webhook"]
    assert (row(a).state, row(a).next_at) == ("pending", at(5))
    assert backend.cancel(b, now=at(5)) == ["webhook"]
    assert backend.cancel(b, now=at(6)) == []
    assert backend.retry_now(b, now=at(6)) == []
    assert backend.complete_pending(a, now=at(7)) == ["webhook"]
    assert states(a, b) == ["completed", "cancelled"]


# -- each rule once: the SQL says what rules/ says -----------------------------------


def test_the_due_rule_in_sql_is_rules_states_due():
    """Every state and lease, at several times: the SQL ``due`` fragment (and MariaDB's
    two halves of it, which its claim asks) keeps exactly what ``states.due`` keeps."""
    insert("r0", "r1", next_at=-1)
    backend = store()
    for intent, _ in claim(now=0, lease=5):
        if intent.event_id == "r1":
            backend.renew(intent.id, intent.claim_token, now=at(0), until=at(20))
    [_, done] = insert("p0", "p1", next_at=0)
    insert("p9", next_at=9)
    backend.complete_pending(done, now=at(0))
    fragments = [backend.sql.fragment("due")]
    if connection.vendor == "mysql":
        halves = [backend.sql.fragment(name) for name in ("pending_due", "expired_lease")]
        fragments.append(" OR ".join(f"({half})" for half in halves))
    table = backend.table.name
    for now in (-1, 0, 4, 5, 6, 9, 19, 20, 30):
        expected = set(Intent.objects.filter(due(at(now))).values_list("id", flat=True))
        for fragment in fragments:
            statement, params = bind(
                f"SELECT id FROM {table} WHERE {fragment}", {"now": backend.dt(at(now))}
            )
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                assert {id for (id,) in cursor.fetchall()} == expected, (now, fragment)


def test_the_python_claim_order_is_rules_states_claim_order():
    insert(*[f"e{i}" for i in range(12)], next_at=0)
    shuffle = random.Random(37)
    intents = list(Intent.objects.all())
    for index, intent in enumerate(intents):
        intent.priority = shuffle.choice([-1, 0, 0, 2])
        intent.next_at = T0 + timedelta(seconds=shuffle.choice([0, 1]))
        intent.created_at = T0 + timedelta(seconds=shuffle.choice([0, index]))
    by_rule = sorted(intents, key=claim_order)
    for field in reversed(CLAIM_ORDER):  # a stable sort per field, last key first
        name = field.lstrip("-")
        intents.sort(key=lambda intent: getattr(intent, name), reverse=field.startswith("-"))
    assert [i.id for i in by_rule] == [i.id for i in intents]


@pytest.mark.django_db(databases=[])
def test_every_database_defines_the_same_statements_for_the_shared_verbs():
    shared = {
        "insert",
        "claim",
        "probe",
        "renew",
        "complete",
        "attempts",
        "retry",
        "cancel_claim",
        "release",
        "complete_pending",
        "retry_now",
        "cancel",
        "exhausted",
        "complete_many",
        "finish_many",
        "live_leases",
        "ordered_heads",
        "due_by_id",
        "target_rows",
        "target_insert",
        "target_save",
        "target_delete",
        "target_watch",
        "target_probe",
        "probe_states",
        "target_ended",
        "pause",
        "resume",
        "paused",
        "kinds",
        "oldest_due",
        "administer_select",
        "administer_retry_now",
        "administer_cancel",
        "administer_select_cancelled",
        "administer_redrive",
        "rollup_add",
        "rate_starts",
        "rate_record",
        "rate_prune",
        "target_paces",
        "pace_successes",
        "pace_starts_delete",
        "replica_lag",
    }
    own = {
        "sqlite": {"claim_update", "begin_immediate", "commit", "rollback", "data_version"},
        "mysql": {
            "clock",
            "claim_update",
            "kind_of",
            "exhausted_cancel",
            "lock_running",
            "get_lock",
            "release_lock",
        },
        "postgresql": {
            "clock",
            "listen",
            "listen_priority",
            "notify",
            "claim_zero",
            "notify_kinds",
            "limited_claim",
            "limited_claim_capped",
            "limited_claim_zero",
            "limited_claim_zero_capped",
            "limited_claim_head",
            "limited_claim_head_capped",
            "roomy_claim",
            "roomy_claim_zero",
            "limit_lock",
            "limit_lock_only",
            "scan",
            "claim_update",
            "serial_plans",
            "parallel_plans",
            "finished_batch",
            "keep_keys",
            "move_out",
            "days",
            "unfinish",
        },
    }
    for vendor, names in own.items():
        assert vendor_names(vendor) == shared | names, vendor


# -- the statements' loader ----------------------------------------------------------


@pytest.mark.django_db(databases=[])
def test_bind_sends_positional_placeholders_and_expands_only_lists():
    statement = (
        "UPDATE t SET a = %(now)s WHERE id IN ([ids]) AND (k, v) IN ([pairs:(%s, %s)]) "
        "AND b = %(now)s AND c = ANY (%(array)s)"
    )
    params = {"now": 1, "ids": ["x", "y"], "pairs": [("k", "v")], "array": ["p", "q"]}
    assert bind(statement, params) == (
        "UPDATE t SET a = %s WHERE id IN (%s, %s) AND (k, v) IN ((%s, %s)) "
        "AND b = %s AND c = ANY (%s)",
        [1, "x", "y", "k", "v", 1, ["p", "q"]],
    )


@pytest.mark.django_db(databases=[])
def test_an_empty_list_is_one_group_of_nulls_which_no_row_matches():
    statement = "SELECT 1 WHERE k IN ([ks]) AND (a, b) IN ([ps:(%s, %s)]) AND CASE x [ws:WHEN %s THEN %s] END"
    assert bind(statement, {"ks": [], "ps": [], "ws": []})[0] == (
        "SELECT 1 WHERE k IN (NULL) AND (a, b) IN ((NULL, NULL)) AND CASE x WHEN NULL THEN NULL END"
    )
    assert spread("VALUES [rows:(%s, %s)]", rows=2) == "VALUES (%s, %s), (%s, %s)"


@pytest.mark.django_db(databases=[])
def test_a_group_may_name_the_statements_own_parameters():
    statement = "SELECT [kinds:(SELECT %s, %(now)s)]"
    assert bind(statement, {"now": 9, "kinds": ["a", "b"]}) == (
        "SELECT (SELECT %s, %s), (SELECT %s, %s)",
        ["a", 9, "b", 9],
    )


@pytest.mark.django_db(databases=[])
def test_the_sql_files_name_only_the_states_rules_states_defines():
    """State names are literals in the SQL (partial indexes match them), so a
    renamed state would leave them behind: every one must be a ``State``, or a
    ``TargetHealth`` (the states of ``TargetState``, SPEC §14)."""
    named = set()
    for path in SQL.glob("*.sql"):
        named |= set(re.findall(r"state\s*(?:=|<>)\s*'(\w+)'", path.read_text()))
    known = {state.value for state in State} | {health.value for health in TargetHealth}
    assert named and named <= known, named
    assert {health.value for health in BLOCKING} <= named


@pytest.mark.django_db
def test_a_server_that_replicates_from_no_primary_says_it_is_not_replaying():
    """``replica_lag`` on each database as the suite runs it: a primary (PostgreSQL,
    MariaDB: ``SHOW SLAVE STATUS`` has no row) or a file (SQLite)."""
    assert replica_lag(backend_for(connection, Intent)) == Lag(replaying=False)
