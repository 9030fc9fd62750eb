import re
from datetime import timedelta

import pytest

from django_intents.models import Intent
from django_intents.rules.days import day_of
from django_intents.store import ClaimFilters, backend_for
from django_intents.store.statements import bind

from .conftest import T0, at, branch_plan, enqueue, intents, row, rows_table, snapshot

pytestmark = pytest.mark.django_db


def test_claim_on_an_empty_queue_returns_none():
    assert Intent.objects.claim(now=T0) is None


def test_claim_sets_running_attempt_token_and_lease():
    [id] = enqueue()
    intent = Intent.objects.claim(now=at(1), lease=20)
    assert intent.id == id
    stored = row(id)
    for obj in (intent, stored):
        assert obj.state == Intent.State.RUNNING
        assert obj.attempts == 1
        assert obj.claim_until == at(21)
        assert obj.updated_at == at(1)
        assert len(obj.claim_token) == 32
        int(obj.claim_token, 16)
    assert intent.claim_token == stored.claim_token
    assert intent.payload == {"n": 0}


def test_claim_default_lease_comes_from_settings(settings):
    settings.INTENTS = intents(LEASE=7)
    enqueue()
    assert Intent.objects.claim(now=T0).claim_until == at(7)


def test_claim_accepts_a_timedelta_lease():
    enqueue()
    assert Intent.objects.claim(now=T0, lease=timedelta(minutes=2)).claim_until == at(120)


def test_claim_skips_intents_not_yet_due():
    enqueue(next_at=at(10))
    assert Intent.objects.claim(now=at(9)) is None
    assert Intent.objects.claim(now=at(10)) is not None


def test_claim_takes_oldest_next_at_then_created_at_then_id():
    late = Intent.objects.enqueue("job", "late", "t", next_at=at(5), now=T0)
    b = Intent.objects.enqueue("job", "b", "t", next_at=at(1), now=at(1), id="b" * 64)
    a = Intent.objects.enqueue("job", "a", "t", next_at=at(1), now=at(1), id="a" * 64)
    early = Intent.objects.enqueue("job", "early", "t", next_at=at(1), now=T0)
    order = [Intent.objects.claim(now=at(10)).id for _ in range(4)]
    assert order == [early, a, b, late]


def test_claim_many_returns_up_to_limit_in_claim_order_with_distinct_tokens():
    ids = [Intent.objects.enqueue("job", str(i), "t", next_at=at(10 - i), now=T0) for i in range(5)]
    claimed = Intent.objects.claim_many(3, now=at(20))
    assert [i.id for i in claimed] == [ids[4], ids[3], ids[2]]
    assert len({i.claim_token for i in claimed}) == 3
    assert Intent.objects.filter(state="running").count() == 3
    assert [i.id for i in Intent.objects.claim_many(10, now=at(20))] == [ids[1], ids[0]]
    assert Intent.objects.claim_many(10, now=at(20)) == []


def test_claim_restricted_to_kinds():
    Intent.objects.enqueue("push", "e", "t", now=T0)
    hook = Intent.objects.enqueue("webhook", "e", "t", now=at(1))
    assert Intent.objects.claim(now=at(2), kinds=["webhook"]).id == hook
    assert Intent.objects.claim(now=at(2), kinds={"webhook", "job"}) is None
    assert Intent.objects.claim(now=at(2), kinds=[]) is None
    assert row(hook).state == "running"
    assert Intent.objects.filter(kind="push", state="pending").count() == 1


def test_claim_does_not_take_a_running_intent_with_a_live_lease():
    enqueue()
    Intent.objects.claim(now=T0, lease=30)
    assert Intent.objects.claim(now=at(29)) is None


def test_intents_whose_ids_share_a_long_prefix_get_distinct_tokens_each_the_rows_own():
    # Ids are any string: a token made from part of the id would repeat here, and
    # one hashed from other bytes than the pool hashes would fence every claim.
    ids = [
        Intent.objects.enqueue("job", str(i), "t", now=T0, id=f"commande-é-{i:036d}-{'ü' * 10}")
        for i in range(300)
    ]
    claimed = Intent.objects.claim_many(300, now=at(1))
    assert sorted(i.id for i in claimed) == sorted(ids)
    assert len({i.claim_token for i in claimed}) == 300
    stored = dict(Intent.objects.values_list("id", "claim_token"))
    assert all(stored[i.id] == i.claim_token and len(i.claim_token) == 32 for i in claimed)
    # Every token completes its own intent: the fence is the row's token, not a guess.
    assert len(Intent.objects.complete_many([(i.id, i.claim_token) for i in claimed])) == 300


def test_claim_takes_over_an_expired_lease_with_a_new_token():
    [id] = enqueue()
    first = Intent.objects.claim(now=T0, lease=30)
    second = Intent.objects.claim(now=at(30), lease=30)
    assert second.id == id
    assert second.claim_token != first.claim_token
    assert second.attempts == 2
    assert row(id).claim_until == at(60)


def test_claim_never_takes_terminal_intents():
    done, gone = enqueue(2)
    Intent.objects.claim_many(2, now=T0)
    Intent.objects.complete(done, row(done).claim_token, now=at(1))
    Intent.objects.cancel(gone, now=at(1))
    assert Intent.objects.claim(now=at(10_000)) is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"lease": -1}, ValueError),
        ({"lease": 0}, ValueError),
        ({"lease": timedelta(seconds=-5)}, ValueError),
        ({"lease": float("inf")}, ValueError),
        ({"lease": "30"}, TypeError),
        ({"lease": True}, TypeError),
        ({"kinds": "webhook"}, TypeError),
        ({"kinds": [""]}, ValueError),
        ({"now": "now"}, TypeError),
    ],
)
def test_claim_refuses_bad_options_and_changes_nothing(kwargs, error):
    enqueue()
    before = snapshot()
    with pytest.raises(error):
        Intent.objects.claim(**{"now": T0, **kwargs})
    assert snapshot() == before


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3"])
def test_claim_many_refuses_a_bad_limit(limit):
    enqueue()
    before = snapshot()
    with pytest.raises(ValueError, match="limit"):
        Intent.objects.claim_many(limit, now=T0)
    assert snapshot() == before


class TestMaxAttempts:
    @pytest.fixture(autouse=True)
    def _max(self, settings):
        settings.INTENTS = intents(MAX_ATTEMPTS=2, LEASE=10)

    def test_expired_lease_on_the_last_attempt_is_cancelled_not_reclaimed(self):
        [id] = enqueue()
        Intent.objects.claim(now=T0)
        token = Intent.objects.claim(now=at(10)).claim_token
        assert Intent.objects.claim(now=at(20)) is None
        intent = row(id)
        assert intent.state == "cancelled"
        assert intent.attempts == 2
        assert "MAX_ATTEMPTS=2" in intent.last_error
        assert (intent.claim_token, intent.claim_until) == ("", None)
        assert Intent.objects.complete(id, token, now=at(21)) is False

    def test_a_claim_above_a_floor_neither_claims_nor_cancels_an_exhausted_lease(self):
        [id] = enqueue()
        Intent.objects.claim(now=T0)
        Intent.objects.claim(now=at(10))  # the last allowed attempt; its lease ends at(20)
        assert Intent.objects.claim_many(5, now=at(30), since=T0) == []
        assert (row(id).state, row(id).attempts) == ("running", 2)
        assert Intent.objects.claim_many(5, now=at(31)) == []  # the pool's full claim
        assert row(id).state == "cancelled"

    def test_expired_lease_with_attempts_left_is_reclaimed(self):
        [id] = enqueue()
        Intent.objects.claim(now=T0)
        assert Intent.objects.claim(now=at(10)).id == id


class TestQueryPlan:
    """Claiming must stay one index-backed lookup however many rows are finished."""

    def test_claim_uses_the_claimable_index(self, vendor):
        from django.db import connection

        items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(300)]
        Intent.objects.enqueue_many(items, now=T0)
        backend = backend_for(connection, Intent)
        queries = backend.claim_queries(now=at(1), limit=10, filters=ClaimFilters())
        index = "intents_claim_mysql_idx" if vendor == "mysql" else "intents_claimable_idx"
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute("ANALYZE django_intents_intent")
                cursor.execute("SET enable_seqscan = off")
            plans = []
            for statement, params in queries:
                explain = "EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN "
                cursor.execute(explain + statement.replace(" FOR UPDATE SKIP LOCKED", ""), params)
                plans.append(" ".join(str(part) for line in cursor.fetchall() for part in line))
            if vendor == "postgresql":
                cursor.execute("SET enable_seqscan = on")
        for plan in plans[:1]:  # MariaDB's expired-lease branch uses the same index
            assert index in plan, plan
            assert "TEMP B-TREE" not in plan.upper(), plan

    def test_the_table_has_only_the_indexes_its_queries_use(self, vendor):
        from django.db import connection

        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, rows_table(connection))
        names = {name for name, info in found.items() if info["index"] and not info["primary_key"]}
        # The admin's: counts per kind and state, kinds, event ids; the newest first.
        expected = {"intents_kind_state_event_idx", "intents_created_idx"}
        if vendor == "mysql":
            expected |= {
                "intents_claim_mysql_idx",
                "intents_lease_mysql_idx",
                "intents_finished_mysql_idx",
                "intents_prioritized_mysql_idx",
                "intents_ordered_mysql_idx",
            }
        else:
            expected |= {
                "intents_claimable_idx",
                "intents_lease_idx",
                "intents_finished_idx",
                "intents_high_priority_idx",
                "intents_low_priority_idx",
                "intents_ordered_idx",  # ordered kinds' heads (test_ordered.py)
            }
        # Migration 0003: no varchar_pattern_ops copy of the primary key on PostgreSQL,
        # no condition-less copies of the partial indexes on MySQL.
        assert names == expected


@pytest.mark.django_db(transaction=True)
def test_the_kind_filter_looks_unselective_to_the_planner_after_a_vacuum(vendor):
    """VACUUM has run but ANALYZE never has (autovacuum off): PostgreSQL knows
    the table's size but nothing of its values.

    If the kind filter then looked selective, the planner would expect a
    handful of due rows and fetch and sort all of them rather than walk the
    claim index in order and stop at LIMIT: on a large backlog (half a million
    churned rows in bench/) that made every claim cost as much as the backlog.
    """
    if vendor != "postgresql":
        pytest.skip("VACUUM and the planner's estimates are PostgreSQL's")
    from django.db import connection

    items = [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(2000)]
    Intent.objects.enqueue_many(items, now=T0)
    table = Intent._meta.db_table
    backend = backend_for(connection, Intent)
    filters, params = bind(
        backend.sql.fragment("of_kinds"), {"every_kind": False, "kinds": ["job", "other"]}
    )
    [(claim, claim_params)] = backend.claim_queries(
        now=at(1), limit=8, filters=ClaimFilters(kinds=["job", "other"], since=T0)
    )
    with backend.cursor() as cursor:
        cursor.execute(f"VACUUM {table}")
        cursor.execute(f"EXPLAIN SELECT id FROM {table} WHERE {filters}", params)
        estimate = int(re.search(r"rows=(\d+)", cursor.fetchone()[0]).group(1))
        cursor.execute("EXPLAIN " + claim, claim_params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert estimate > 1800, f"the kind filter is estimated to keep {estimate} of 2000 rows"
    zero = branch_plan(plan, "zero")  # the other priorities' branches hold no rows here
    assert "Index Scan using intents_claimable_idx" in zero, plan
    assert "Sort" not in zero, plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("statement", ["complete_many", "finish_many"])
def test_a_batch_of_results_finds_its_rows_by_primary_key_not_through_the_lease_index(
    vendor, statement
):
    """After churn with no VACUUM, the lease index holds a dead entry for every claim
    ever made; a batch that joined against it read them all (500,400 entries for
    400 results in bench/, 64 ms a batch). It must look its rows up by id."""
    if vendor != "postgresql":
        pytest.skip("the batched results' statements are PostgreSQL's")
    from django.db import connection

    Intent.objects.enqueue_many(
        [{"kind": "job", "event_id": str(i), "target": "t"} for i in range(3000)], now=T0
    )
    churned = Intent.objects.claim_many(2600, now=at(1), lease=30)
    Intent.objects.complete_many([(i.pk, i.claim_token) for i in churned], now=at(2))
    batch = Intent.objects.claim_many(400, now=at(3), lease=30)
    ids, tokens = [i.pk for i in batch], [i.claim_token for i in batch]
    backend = backend_for(connection, Intent)
    sql, params = bind(backend.sql[statement], batch_params(ids, tokens))
    with backend.cursor() as cursor:
        # A table this small is best scanned whole; on a large one, that is
        # the choice the planner no longer has.
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert "intents_lease_idx" not in plan, plan
    assert "Index Scan on django_intents_intent_pkey" in plan.replace(" using ", " on "), plan


@pytest.mark.django_db(transaction=True)
def test_after_an_analyze_of_pending_intents_each_statement_meets_a_claimed_row_once_by_key(vendor):
    """An ANALYZE that saw only pending intents tells the planner that nothing
    runs. From it, on a table of 20,000, the batched results compared every
    running row with every row of the batch (a nested loop with a join
    filter: up to 2.3 s a batch) and a renewal walked the lease index: a drain
    of 20,000 took 40 s instead of 1.5 and lost leases on the way. Each
    statement must meet a claimed row through its key, at most once."""
    if vendor != "postgresql":
        pytest.skip("the plans are PostgreSQL's")
    from django.db import connection

    for start in range(0, 20_000, 2_000):
        Intent.objects.enqueue_many(
            [
                {"kind": "job", "event_id": str(i), "target": "t"}
                for i in range(start, start + 2_000)
            ],
            now=T0,
        )
    backend = backend_for(connection, Intent)
    with backend.cursor() as cursor:
        cursor.execute(f"ANALYZE {Intent._meta.db_table}")
    batch = Intent.objects.claim_many(400, now=at(1), lease=30)
    ids, tokens = [i.pk for i in batch], [i.claim_token for i in batch]
    tail = {"salt": "salt", "until": at(31)}
    filters = ClaimFilters(kinds=["job"], since=None, max_attempts=5)
    one = {"id": ids[0], "token": tokens[0], "now": at(4), "until": at(40)}
    statements = {
        "complete_many": bind(backend.sql.complete_many, batch_params(ids, tokens)),
        "finish_many": bind(backend.sql.finish_many, batch_params(ids, tokens)),
        "renew": bind(backend.sql.renew, one),
        "complete": bind(backend.sql.complete, one),
        "claim of priority 0": backend.zero_claim_query(
            now=at(2), limit=250, filters=filters, tail=tail
        ),
        "claim of every priority": backend.claim_queries(
            now=at(2), limit=250, filters=filters, tail=tail
        )[0],
    }
    by_primary_key = {"renew", "complete"}
    for name, (statement, params) in statements.items():
        with backend.cursor() as cursor:
            cursor.execute("EXPLAIN " + statement, params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "intents_lease_idx" not in plan, (name, plan)
        assert "Join Filter" not in plan, (name, plan)  # a row of one side against all of the other
        if name in by_primary_key:
            assert "Index Scan using django_intents_intent_pkey" in plan, (name, plan)


def batch_params(ids: list[str], tokens: list[str]) -> dict[str, object]:
    """The parameters of PostgreSQL's ``complete_many`` and ``finish_many`` (releases)."""
    n = len(ids)
    return {
        "now": at(4),
        "day": day_of(at(4)),
        "partition": f"django_intents_d{day_of(at(4))}",
        "ids": ids,
        "tokens": tokens,
        "states": ["pending"] * n,
        "next_ats": [at(9)] * n,
        "errors": ["e"] * n,
        "snoozed": [False] * n,
        "unstarted": [False] * n,
        "tracebacks": [None] * n,
    }


def test_every_claim_statement_fits_psycopgs_cache_of_converted_queries(vendor):
    """psycopg converts a statement's ``%s`` to ``$n`` with a regular expression, and
    caches the result only for statements of at most 4,096 bytes and 50 parameters:
    a longer claim paid the conversion again on every call (0.5 ms, more than the
    claim's own execution)."""
    if vendor != "postgresql":
        pytest.skip("the cache is psycopg's, PostgreSQL's driver")
    from django.db import connection
    from psycopg import _queries

    from django_intents.rules.limits import Limit

    backend = backend_for(connection, Intent)
    kinds = ["webhook", "a.rather.long.kind.name", "another.kind"]
    limits = {"webhook": Limit(running=5, per_target=4), "another.kind": Limit(running=9)}
    worst = ClaimFilters(kinds=kinds, since=T0, max_attempts=5)
    tail = ["salt", at(30), at(1)]
    statements = [
        backend.claim_queries(now=at(1), limit=8, filters=worst)[0],
        *[
            backend.candidate_queries(
                now=at(1),
                limit=8,
                filters=ClaimFilters(kinds=kinds, since=since, max_attempts=5, limits=limits),
                zero=zero,
            )[0]
            for zero in (False, True)
            for since in (T0, None)  # None: a full claim, which looks for the held-back head
        ],
        *[
            backend.limited.roomy_query(
                now=at(1),
                limit=8,
                filters=ClaimFilters(kinds=kinds, since=T0, max_attempts=5, limits=limits),
                zero=zero,
            )
            for zero in (False, True)
        ],
    ]
    statements.append(backend.zero_claim_query(now=at(1), limit=8, filters=worst))
    # The portable claim of rated and ordered kinds (store/limited.py), statement by statement.
    ordered = ClaimFilters(
        kinds=kinds,
        since=T0,
        max_attempts=5,
        ordered=("webhook",),
        full_kinds=("another.kind",),
        full_targets=(("webhook", "https://example.com/a"),),
    )
    statements.append(backend.scan_query(now=at(1), limit=8, filters=ordered))
    for name in ("ordered_heads", "due_by_id", "claim_update"):
        params = {"now": at(1), "kinds": [], "targets": [], "ids": [], "max_attempts": 5}
        statements.append(bind(backend.sql[name], {**params, "salt": "s", "until": at(30)}))
    for statement, params in statements:
        assert len(statement.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, statement
        assert len(params) + len(tail) + 1 <= _queries.MAX_CACHED_STATEMENT_PARAMS, statement
