"""``bench/run.py --quick`` and ``bench/partners.py --quick`` run end to end and report every figure.

Only the shape of the report is checked, never a speed: CI machines differ,
and docs/benchmarks.md is where the figures of a real run are published.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0


def run_bench(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A bench command as its docs show it: this Python, from the checkout's root."""
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the quick bench runs on SQLite whatever the suite's database: in the SQLite run",
)
def test_quick_benchmark_on_sqlite_reports_every_workload(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "BENCH_WORK": str(tmp_path / "work")}
    env.pop("BENCH_CODE", None)
    done = run_bench(
        ["bench/run.py", "--quick", "--db", "sqlite", "--peers", "none"] + ["--json", str(out)],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for title in ("Enqueue", "Drain", "Latency", "Large table", "Crash cost", "IO", "Processes"):
        assert f"### {title}" in done.stdout

    report = json.loads(out.read_text())
    assert report["meta"]["quick"] is True
    assert positive(report["meta"]["cores"])
    [result] = report["results"]
    assert (result["system"], result["db"]) == ("intents", "sqlite")

    enqueue = result["enqueue"]
    assert positive(enqueue["one"]["per_s"]) and positive(enqueue["many"]["per_s"])
    assert [row["workers"] for row in result["drain"]] == [1, 4, 8]
    for row in result["drain"]:
        assert positive(row["per_s"]) and positive(row["seconds"]) and positive(row["cpu_s"])
        assert row["n"] == report["meta"]["sizes"]["drain"]
    assert positive(result["startup_cpu_s"])

    latency = result["latency"]
    assert positive(latency["p50_ms"]) and latency["p99_ms"] >= latency["p50_ms"]
    assert latency["n"] == report["meta"]["sizes"]["latency"]

    large = result["large"]
    assert positive(large["per_s"]) and positive(large["churned"])

    [crash] = result["crash"]
    assert positive(crash["lease_s"]) and positive(crash["seconds"])

    # Several processes on one queue: every job ran exactly once, shared out.
    sizes = report["meta"]["sizes"]
    assert [row["processes"] for row in result["processes"]] == sizes["process_counts"]
    for row in result["processes"]:
        assert (row["done"], row["executions"]) == (sizes["processes_n"], sizes["processes_n"])
        assert (row["duplicates"], row["never_ran"]) == (0, 0)
        assert positive(row["per_s"]) and sum(row["shares"]) == pytest.approx(1)

    # The io workload: the timer variants always run (the HTTP ones only where
    # the bench group installed aiohttp and urllib3); every job ends where its
    # variant says, succeeding or failing.
    io = {row["variant"]: row for row in result["io"]}
    assert {"time.sleep", "asyncio.sleep", "time.sleep, fails", "asyncio.sleep, fails"} <= set(io)
    for row in io.values():
        assert "error" not in row, row
        assert row["n"] == report["meta"]["sizes"]["io"]
        assert row["wrong"] == 0 and row["left"] == 0, row
        assert positive(row["per_s"]) and positive(row["cpu_s"]) and positive(row["rss_mb"])


@pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the bench runs on SQLite whatever the suite's database: in the SQLite run",
)
def test_rate_claim_bench_times_every_case(tmp_path):
    env = {**os.environ, "BENCH_WORK": str(tmp_path), "BENCH_DB": "sqlite"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = run_bench(
        ["-m", "bench.rate_claim", "--targets", "20", "--claims", "3"],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| 20 ")]
    assert [row[1].strip() for row in rows] == [
        "unrated",
        "rated, no starts",
        "rated, 5 starts per target",
        "rated, half spent",
    ]
    assert all(positive(float(row[2])) and float(row[3]) >= float(row[2]) for row in rows)


def test_partners_healthy_scenario_delivers_every_intent_and_reports_its_rate(tmp_path):
    """``bench/partners.py --scenario healthy --quick`` on the suite's database, end to end.

    The other scenarios need SPEC §14's rate, held targets, breaker, order and
    redrive; this one is the baseline they are measured against, so it must
    run on every database as it is.
    """
    out = tmp_path / "partners.json"
    suffix = os.environ.get("INTENTS_TEST_DB_SUFFIX", "")
    env = {**os.environ, "BENCH_WORK": str(tmp_path / "work")}
    env["BENCH_DB_PREFIX"] = f"partners_smoke{suffix}"  # never the bench's own database
    env.pop("BENCH_CODE", None)
    done = run_bench(
        ["-m", "bench.partners", "--scenario", "healthy", "--quick"]
        + ["--db", connection.vendor, "--json", str(out)],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| healthy | 16 healthy |" in done.stdout

    report = json.loads(out.read_text())
    assert report["meta"]["quick"] is True and report["meta"]["workers"] == 32
    [run] = report["runs"]
    assert report["baseline_per_s"] == run["healthy"]["per_s"]
    assert run["partners"] == [] and not run["timed_out"] and run["exit"] == 0, run
    healthy, n = run["healthy"], report["meta"]["sizes"]["healthy"]
    # Every intent delivered once, as the partner counted them, and completed in its row.
    assert healthy["delivered"] == healthy["n"] == n
    assert run["states"] == {"bench.partner.healthy": {"completed": n}}
    assert positive(healthy["per_s"]) and positive(healthy["seconds"])
    assert positive(healthy["p50_s"]) and healthy["p99_s"] >= healthy["p50_s"]


@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="the admin bench's --fast-fill is spelled for PostgreSQL and MariaDB (SQLite has no sha256)",
)
def test_the_admin_benchs_fast_fill_writes_the_rows_enqueue_many_would_in_its_mix():
    """The 5,000,000-row figures come from this fill: its ids must be the ones
    enqueue gives (a search by id prefix finds them, an enqueue is a no-op)."""
    from datetime import UTC, datetime

    from bench.admin_bench import SPAN, fast_fill
    from django_intents.models import Intent

    start = datetime(2026, 11, 1, tzinfo=UTC)
    fast_fill(1000, start, ["webhook", "job", "push"])

    states = {s: Intent.objects.filter(state=s).count() for s in Intent.State.values}
    # Out of every hundred: 95 completed, 2 cancelled, 3 pending, of which the
    # one at 98 is running among the newest 20,000 (all of these 1,000).
    assert states == {"completed": 950, "cancelled": 20, "pending": 20, "running": 10}
    assert Intent.objects.filter(state="pending", attempts=2).exclude(last_error="").count() == 10
    assert not Intent.objects.filter(state="running", claim_until__isnull=True).exists()
    # Every kind has its share of each state, as a queue's kinds do.
    for state in Intent.State.values:
        kinds = set(Intent.objects.filter(state=state).values_list("kind", flat=True))
        assert kinds == {"webhook", "job", "push"}, state

    first, last = Intent.objects.get(event_id="event-0"), Intent.objects.get(event_id="event-999")
    assert (first.kind, first.target) == ("webhook", "https://partner-0.example/hook")
    assert (last.kind, last.target) == ("webhook", "https://partner-49.example/hook")
    assert first.created_at == start and start < last.created_at < start + SPAN
    assert last.payload == {"n": 999}
    # The same ids as enqueue_many's: enqueuing the same triples adds nothing.
    triples = Intent.objects.filter(event_id__in=["event-0", "event-7", "event-999"])
    again = Intent.objects.enqueue_many(
        {"kind": i.kind, "event_id": i.event_id, "target": i.target} for i in triples
    )
    assert sorted(again) == sorted(triples.values_list("pk", flat=True))
    assert Intent.objects.count() == 1000


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="a snapshot that holds back vacuum is PostgreSQL's: in the PostgreSQL run",
)
def test_mvcc_bench_drains_every_wave_under_a_held_snapshot_and_reports_it(tmp_path):
    """``bench/mvcc.py`` on django-intents alone, three small waves: every job of every
    wave done (the bench fails otherwise), the blocker seen holding the horizon, and
    the dead rows it kept reported, then the table after it ended."""
    out = tmp_path / "mvcc.json"
    suffix = os.environ.get("INTENTS_TEST_DB_SUFFIX", "")
    env = {**os.environ, "BENCH_WORK": str(tmp_path), "BENCH_MVCC_PREFIX": f"mvcc{suffix}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = run_bench(
        ["-m", "bench.mvcc", "--systems", "intents", "--waves", "3", "--n", "300"]
        + ["--workers", "2", "--settle", "1", "--json", str(out)],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["held_back_xmin"] == [True]
    [waves] = [report["systems"]["intents"]["waves"]]
    assert len(waves) == 3
    for row in waves:
        assert positive(row["per_s"]) and positive(row["enqueue_per_s"]) and positive(row["mb"])
        assert positive(row["claims"]) and row["claim_p99_ms"] >= row["claim_p50_ms"] > 0
    # Each wave's claims and completions leave dead versions the snapshot keeps.
    assert waves[-1]["dead"] > waves[0]["dead"] > 0
    assert positive(report["systems"]["intents"]["ratio"])
    assert "waves of 300 no-op jobs, a REPEATABLE READ snapshot held open" in done.stdout


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="the history bench fills its table with PostgreSQL's generate_series: in that run",
)
def test_history_bench_drains_beside_stored_finished_intents_and_compares(tmp_path):
    """``bench/history.py`` small: the filled table really holds the history beside
    what each round drained, every round drained both tables, the ratios come from
    the medians it reports, and its prune deleted the old history and only that."""
    out = tmp_path / "history.json"
    suffix = os.environ.get("INTENTS_TEST_DB_SUFFIX", "")
    env = {**os.environ, "BENCH_WORK": str(tmp_path), "BENCH_HISTORY_SUFFIX": suffix}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = run_bench(
        ["-m", "bench.history", "--history", "3000", "--n", "200"]
        + ["--rounds", "2", "--workers", "2", "--prune-days", "24", "--json", str(out)],
        env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert sorted((run["round"], run["side"]) for run in report["runs"]) == [
        (1, "empty"),
        (1, "full"),
        (2, "empty"),
        (2, "full"),
    ]
    for run in report["runs"]:
        assert positive(run["per_s"]) and positive(run["claims"]) and positive(run["claim_total_s"])
    medians = report["medians"]
    assert report["rate_ratio"] == pytest.approx(
        medians["full"]["per_s"] / medians["empty"]["per_s"]
    )
    assert "stored 3,000 finished intents" in done.stdout

    import psycopg  # the PostgreSQL run only

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        dbname=f"histfull{suffix}_intents",
    ) as conn:
        counts = dict(
            conn.execute(
                "SELECT event_id LIKE %s, count(*) FROM django_intents_intent "
                "WHERE state = 'completed' GROUP BY 1",
                ["history-%"],
            ).fetchall()
        )
    # The prune deleted the oldest fifth of the history (older than 24 of its 30
    # days), and nothing the rounds drained a moment ago.
    assert report["prune"]["deleted"] == pytest.approx(600, abs=2)
    assert counts == {True: 3000 - report["prune"]["deleted"], False: 200 + 200 + 200}
