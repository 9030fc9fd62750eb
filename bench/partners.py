"""The relay probe with partners that behave like partners (issue 39, SPEC §14).

    python -m bench.partners [--scenario healthy|rate|hold|breaker|ordered|redrive|all]
                             [--db postgresql] [--quick] [--json out.json]

Sixteen healthy partners get deliveries while one partner misbehaves the
way real ones do (``bench/partner_server.py``), and the queue treats it the
way SPEC §14 says; one worker process, 32 async handlers
(``bench/benchapp/partner_calls.py``). Each scenario is its own run, after a
run of the healthy partners alone that is the baseline of the others:

- ``healthy``: the sixteen alone;
- ``rate``: a partner that answers 429 above 20 requests/s, its kind with
  ``"rate": "20/s"``: 429s at most 1 % of its requests;
- ``hold``: the same partner, no rate, its handler raising
  ``Retry(after=retry_after(headers), hold_target=True)``: at most 5 %;
- ``breaker``: a partner down (connections reset) for ``--outage`` seconds,
  then up, its kind with ``"breaker": {"failures": 5, "cooldown": 2}``:
  attempts while down at most F plus one probe per cooldown that fits in the
  outage, and its first delivery within C·2^k + 1 s of its return (k: the
  doublings its cooldown had reached, read from the breaker's row);
- ``ordered``: partners that check each target's intents arrive in order
  and fail the first try of every tenth, ``"ordered": True``: none out of order;
- ``redrive``: the down partner without a breaker and ``MAX_ATTEMPTS`` 3,
  down for the outage or until its intents are all cancelled (retries wait
  behind the healthy backlog, due before them): once they are and it is
  back, ``manage.py intents_redrive
  --target T --since <run start>`` re-queues exactly those (not the ones
  cancelled before the run) and they are delivered;
- ``all``: every scenario above, each its own run, then all the bad partners
  together in one.

Every run also gives the healthy partners' deliveries/s next to the
baseline's (at least 0.9 of it, the issue asks): the mean of the healthy
run before the others and the one after them. ``--quick`` is a smoke test:
fewer intents and a 10 s outage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, bench/partners.py
    sys.path.insert(0, str(ROOT))

from bench.io_workload import _free_port, _last_log_line, _reap  # noqa: E402
from bench.relay_workload import _percentile  # noqa: E402
from bench.report import _n, _table  # noqa: E402
from bench.systems import MANAGE  # noqa: E402

KIND = "bench.partner."
# The bad partners, in the order of the report; each is a kind of its own.
BAD = ["rate", "hold", "breaker", "ordered", "redrive"]
SCENARIOS = ["healthy", *BAD, "all"]
WORKERS = 32
FAILURES, COOLDOWN = 5, 2.0  # the breaker's F and C
MAX_ATTEMPTS = 3  # the redrive scenario's: the down partner's intents run out of them
LIMITS: dict[str, dict[str, Any]] = {
    "rate": {"rate": "20/s"},
    "breaker": {"breaker": {"failures": FAILURES, "cooldown": COOLDOWN}},
    "ordered": {"ordered": True},
}
# The handler kinds (bench/benchapp/handlers.py) and the partners' paths.
KINDS = {
    "healthy": KIND + "healthy",
    "rate": KIND + "rate",
    "hold": KIND + "hold",
    "breaker": KIND + "down",
    "ordered": KIND + "ordered",
    "redrive": KIND + "redrive",
}
SIZES = {
    "full": {
        "healthy": 20_000,
        "healthy_targets": 16,
        "rate": 600,
        "hold": 600,
        "breaker": 200,
        "redrive": 200,
        "ordered": 400,
        "ordered_targets": 4,
        "decoys": 5,
        "outage": 30.0,
        "timeout": 300.0,
    },
    "quick": {
        "healthy": 1_000,
        "healthy_targets": 16,
        "rate": 60,
        "hold": 60,
        "breaker": 20,
        "redrive": 20,
        "ordered": 40,
        "ordered_targets": 2,
        "decoys": 2,
        "outage": 10.0,
        "timeout": 120.0,
    },
}


# The bad partners with one target each; the down ones are on the down port.
ONE_TARGET = {
    "rate": "/limited/0",
    "hold": "/limited/1",
    "breaker": "/down/0",
    "redrive": "/down/1",
}


def _paths(partner: str, sizes: dict[str, Any]) -> list[str]:
    """The server paths of a partner's targets."""
    if partner in ("healthy", "ordered"):
        return [f"/{partner}/{n}" for n in range(sizes[f"{partner}_targets"])]
    return [ONE_TARGET[partner]]


@contextmanager
def partner_server(work: Path, env: dict[str, str], outage: float) -> Iterator[tuple[str, str]]:
    """Run ``bench/partner_server.py``; yield its URL and its down port's URL."""
    port, down_port = _free_port(), _free_port()
    argv = [sys.executable, "-m", "bench.partner_server", "--port", str(port)]
    argv += ["--down-port", str(down_port), "--down-for", str(outage)]
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("bench/partner_server.py did not start")
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{down_port}"
    finally:
        proc.terminate()
        _reap([proc], 15)
        proc.stdout.close()


def _call(url: str, body: Any = None, *, post: bool = False) -> Any:
    """A JSON call to the partner server: POST when there is a body or ``post``."""
    data = b"" if post and body is None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")  # noqa: S310 - our own local server
    with urllib.request.urlopen(request) as r:  # noqa: S310 - our own local server
        return json.loads(r.read())


def _spread(lists: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """Interleave every partner's intents evenly, each list keeping its own order.

    Each claim window then sees every partner, as a relay's real backlog does.
    """
    placed = [
        ((i + 0.5) / len(items), n, item)
        for n, items in enumerate(lists)
        for i, item in enumerate(items)
    ]
    return [item for _, _, item in sorted(placed, key=lambda p: (p[0], p[1]))]


def _fill(partners: list[str], sizes: dict[str, Any], urls: dict[str, str]) -> None:
    """Enqueue every partner's intents, spread over its targets and over each other."""
    from django_intents.models import Intent

    lists = []
    for partner in partners:
        targets = [urls[partner] + path for path in _paths(partner, sizes)]
        count = sizes[partner]
        lists.append([(partner, targets[i % len(targets)]) for i in range(count)])
    rows = _spread(lists)
    for start in range(0, len(rows), 500):
        at = time.time()
        Intent.objects.enqueue_many(
            [
                {
                    "kind": KINDS[partner],
                    "event_id": f"{partner}-{start + i}",
                    "target": target,
                    "payload": {"at": at},
                }
                for i, (partner, target) in enumerate(rows[start : start + 500])
            ]
        )


def _expected_order(url: str) -> dict[str, list[str]]:
    """Each ordered target's keys in the order SPEC §14 promises: ``created_at, id``."""
    from django_intents.models import Intent

    order: dict[str, list[str]] = {}
    rows = Intent.objects.filter(kind=KINDS["ordered"]).order_by("created_at", "id")
    for target, key in rows.values_list("target", "event_id"):
        order.setdefault(target.removeprefix(url), []).append(key)
    return order


def _decoys(target: str, count: int) -> list[str]:
    """Intents of the redrive partner cancelled an hour before the run: never redriven."""
    from django_intents.models import Intent

    ids = [
        Intent.objects.enqueue(KINDS["redrive"], f"decoy-{i}", target, {"at": 0})
        for i in range(count)
    ]
    Intent.objects.cancel_many(ids, now=datetime.now(UTC) - timedelta(hours=1))
    return ids


def _open_cooldowns(seconds: float) -> int:
    """How many cooldowns (C, 2C, 4C, ...) end within ``seconds``: the probes a breaker may send."""
    count, spent, cooldown = 0, 0.0, COOLDOWN
    while spent + cooldown <= seconds:
        spent += cooldown
        cooldown *= 2
        count += 1
    return count


def _openings(kind: str, target: str) -> int | None:
    """The breaker's consecutive openings of (kind, target), if it has a row (SPEC §14)."""
    from django_intents.models import TargetState
    from django_intents.rules.targets import target_key

    row = TargetState.objects.filter(key=target_key(kind, target)).first()
    return None if row is None else row.openings


def _running(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` still runs, without reaping it: ``_reap`` wants its rusage."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def _unfinished(kinds: list[str]) -> int:
    from django_intents.models import Intent

    return Intent.objects.filter(kind__in=kinds, state__in=["pending", "running"]).count()


def _redrive(
    env: dict[str, str], work: Path, target: str, since: datetime, log: Path
) -> dict[str, Any]:
    """Run ``manage.py intents_redrive`` as an operator would; count what it moved."""
    from django_intents.models import Intent

    mine = Intent.objects.filter(kind=KINDS["redrive"], target=target)
    cancelled = set(
        mine.filter(state="cancelled", updated_at__gte=since).values_list("id", flat=True)
    )
    argv = [*MANAGE, "intents_redrive", "--target", target, "--since", since.isoformat()]
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120)
    with log.open("a") as out:
        out.write(done.stdout + done.stderr)
    out_row: dict[str, Any] = {"cancelled": len(cancelled), "command": " ".join(argv[2:])}
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        said = lines[0][:200] if lines else "no output"
        return {**out_row, "error": f"intents_redrive exit {done.returncode}: {said}"}
    out_row["redriven"] = mine.filter(id__in=cancelled).exclude(state="cancelled").count()
    out_row["moved_others"] = mine.exclude(id__in=cancelled).exclude(state="cancelled").count()
    return out_row


def run(suite: Any, name: str, partners: list[str], sizes: dict[str, Any]) -> dict[str, Any]:
    """One run: the healthy partners and ``partners``, until every intent is finished."""
    from django.db import connection

    from django_intents.models import TargetState

    suite.reset()
    TargetState.objects.all().delete()
    every = ["healthy", *partners]
    limits = {KINDS[p]: LIMITS[p] for p in partners if p in LIMITS}
    env = {**suite.env, "BENCH_RELAY_POOL": str(WORKERS * 2)}
    if limits:  # an empty LIMITS fails the system check
        env["BENCH_LIMITS"] = json.dumps(limits)
    if "redrive" in partners:
        env["BENCH_MAX_ATTEMPTS"] = str(MAX_ATTEMPTS)
    kinds = [KINDS[p] for p in every]
    row: dict[str, Any] = {"run": name, "partners": partners, "limits": limits}
    row["max_attempts"] = MAX_ATTEMPTS if "redrive" in partners else None
    # The redrive partner stays down until its intents have run out of
    # attempts, which a backlog may delay past the outage: then /up ends it.
    down_for = sizes["timeout"] if "redrive" in partners else sizes["outage"]
    with partner_server(suite.work, suite.env, down_for) as (url, down_url):
        urls = {p: down_url if p in ("breaker", "redrive") else url for p in every}
        targets = {p: [urls[p] + path for path in _paths(p, sizes)] for p in every}
        decoys = _decoys(targets["redrive"][0], sizes["decoys"]) if "redrive" in partners else []
        _fill(every, sizes, urls)
        if "ordered" in partners:
            _call(f"{url}/expect", _expected_order(url))
        since = datetime.now(UTC)
        row["load"] = os.getloadavg()[0]
        with suite.log.open("ab") as log:
            argv = [*MANAGE, "run_intent_workers", "--kinds", ",".join(kinds)]
            argv += ["--concurrency", str(WORKERS), "-v", "0"]
            proc = subprocess.Popen(
                argv, cwd=suite.work, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        started = _call(f"{url}/start", post=True)["started"]
        deadline = time.monotonic() + sizes["timeout"]
        openings: int | None = None
        redrive: dict[str, Any] | None = None
        while _running(proc) and time.monotonic() < deadline:
            stats = _call(f"{url}/stats")
            up = stats["outage"]["up_at"] is not None
            if "breaker" in partners and not up:
                openings = _openings(KINDS["breaker"], targets["breaker"][0]) or openings
            if "redrive" in partners and redrive is None and not _unfinished([KINDS["redrive"]]):
                if up:  # all cancelled, the partner back: the operator's turn
                    redrive = _redrive(env, suite.work, targets["redrive"][0], since, suite.log)
                elif time.time() >= started + sizes["outage"]:
                    _call(f"{url}/up", post=True)
            if _unfinished(kinds) == 0 and ("redrive" not in partners or redrive is not None):
                break
            time.sleep(0.25)
        row["timed_out"] = _running(proc) and _unfinished(kinds) > 0
        row["seconds_total"] = time.monotonic() - (deadline - sizes["timeout"])
        connection.close()
        proc.terminate()
        usages, _ = _reap([proc], 30)
        row["exit"] = abs(proc.returncode or 0)
        row["cpu_s"] = sum(u.ru_utime + u.ru_stime for u in usages)
        stats = _call(f"{url}/stats?latencies=1")
    if redrive is not None:
        row["redrive"] = redrive
    return _figures(row, stats, partners, sizes, targets, urls, openings, decoys, suite)


def _counts(stats: dict[str, Any], partner: str, sizes: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        stats["targets"].get(path) or {"requests": 0, "delivered": 0, "too_many": 0}
        for path in _paths(partner, sizes)
    ]


def _figures(
    row: dict[str, Any],
    stats: dict[str, Any],
    partners: list[str],
    sizes: dict[str, Any],
    targets: dict[str, list[str]],
    urls: dict[str, str],
    openings: int | None,
    decoys: list[str],
    suite: Any,
) -> dict[str, Any]:
    """What the partners counted and the rows say, per partner."""
    from django.db.models import Count

    from django_intents.models import Intent

    healthy = _counts(stats, "healthy", sizes)
    lasts = [t["last"] for t in healthy if t.get("last")]
    delivered = sum(t["delivered"] for t in healthy)
    if not lasts or stats["started"] is None:
        return {
            **row,
            "error": f"no healthy delivery; worker exit {row['exit']}: {_last_log_line(suite)}",
        }
    row["healthy"] = h = {"n": sizes["healthy"], "delivered": delivered}
    h["seconds"] = max(lasts) - stats["started"]
    h["per_s"] = delivered / h["seconds"]
    latencies = [s for path in _paths("healthy", sizes) for s in stats["latencies"].get(path, [])]
    h["p50_s"], h["p99_s"] = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    states = Intent.objects.values("kind", "state").annotate(n=Count("id"))
    by_kind: dict[str, dict[str, int]] = {}
    for found in states:
        by_kind.setdefault(found["kind"], {})[found["state"]] = found["n"]
    row["states"] = by_kind
    outage = stats["outage"]
    for partner in partners:
        counts = _counts(stats, partner, sizes)
        p: dict[str, Any] = {
            "n": sizes[partner],
            "requests": sum(t["requests"] for t in counts),
            "delivered": sum(t["delivered"] for t in counts),
            "states": by_kind.get(KINDS[partner], {}),
        }
        if partner in ("rate", "hold"):
            p["too_many"] = sum(t["too_many"] for t in counts)
            p["too_many_pct"] = p["too_many"] / max(p["requests"], 1) * 100
            p["target_pct"] = 1.0 if partner == "rate" else 5.0
        elif partner == "breaker":
            p["attempts_down"] = outage["attempts_down"].get(_paths("breaker", sizes)[0], 0)
            down_s = None if outage["up_at"] is None else outage["up_at"] - outage["started"]
            p["down_s"] = down_s
            p["allowed_down"] = None if down_s is None else FAILURES + _open_cooldowns(down_s)
            p["openings"] = openings
            first = counts[0].get("first_after_up")
            p["return_to_first_s"] = (
                None if first is None or outage["up_at"] is None else first - outage["up_at"]
            )
            k = None if openings is None else max(openings - 1, 0)
            p["k"] = k
            p["allowed_return_s"] = None if k is None else COOLDOWN * 2**k + 1
        elif partner == "ordered":
            p["out_of_order"] = sum(t.get("out_of_order", 0) for t in counts)
            p["failed_on_purpose"] = sum(t.get("failed", 0) for t in counts)
        elif partner == "redrive":
            p.update(
                row.get("redrive", {"error": "never redriven: its intents were not all finished"})
            )
            p["decoys_still_cancelled"] = Intent.objects.filter(
                id__in=decoys, state="cancelled"
            ).count()
            p["decoys"] = len(decoys)
            p["delivered_after_redrive"] = p["delivered"]
        row[partner] = p
    return row


def _ok(value: bool | None) -> str:
    return "–" if value is None else "yes" if value else "NO"


def _judge(partner: str, p: dict[str, Any]) -> tuple[str, str, bool | None]:
    """A bad partner's figure, what the issue asks of it, and whether that is met."""
    if partner in ("rate", "hold"):
        share = f"{p['too_many']} 429s of {p['requests']} requests: {p['too_many_pct']:.1f} %"
        return share, f"≤ {p['target_pct']:.0f} %", p["too_many_pct"] <= p["target_pct"]
    if partner == "breaker":
        down = p["attempts_down"]
        back, allowed = p["return_to_first_s"], p["allowed_return_s"]
        figure = f"{_n(down)} attempts while down; first delivery {_n(back, 1)} s "
        figure += f"after return (k={_n(p['k'])})"
        asked = f"≤ {p['allowed_down']}; ≤ {_n(allowed, 0)} s"
        if back is None or allowed is None or p["allowed_down"] is None:
            return figure, asked, None
        return figure, asked, down <= p["allowed_down"] and back <= allowed
    if partner == "ordered":
        figure = f"{p['out_of_order']} out of order ({p['failed_on_purpose']} failed on purpose)"
        return figure, "0", p["out_of_order"] == 0
    if "error" in p:
        return p["error"][:100], "all, and only those", False
    figure = f"{p['cancelled']} cancelled, {p['redriven']} redriven, {p['delivered']} delivered; "
    figure += f"decoys kept {p['decoys_still_cancelled']}/{p['decoys']}"
    exact = p["moved_others"] == 0 and p["decoys_still_cancelled"] == p["decoys"]
    return (
        figure,
        "all, and only those",
        p["redriven"] == p["cancelled"] == p["delivered"] > 0 and exact,
    )


def table(report: dict[str, Any]) -> str:
    """One row per (run, partner): its figure beside what the issue asks of it."""
    header = ["run", "partner", "intents", "delivered", "figure", "asked", "met"]
    rows: list[list[str]] = []
    base = report["baseline_per_s"]
    for r in report["runs"]:
        if "error" in r:
            rows.append([r["run"], "", "", "", "error: " + r["error"][:120], "", ""])
            continue
        h = r["healthy"]
        ratio = h["ratio"] = h["per_s"] / base if base and r["partners"] else None
        figure = f"{_n(h['per_s'])}/s, p50/p99 {_n(h['p50_s'], 1)}/{_n(h['p99_s'], 1)} s" + (
            "*" if r["timed_out"] else ""
        )
        asked = ""
        if ratio is not None:
            figure, asked = figure + f", {ratio:.2f} of alone", "≥ 0.9 of alone"
        met = None if ratio is None else ratio >= 0.9
        rows.append(
            [r["run"], "16 healthy", _n(h["n"]), _n(h["delivered"]), figure, asked, _ok(met)]
        )
        for partner in r["partners"]:
            p = r[partner]
            figure, asked, met = _judge(partner, p)
            rows.append(
                [r["run"], partner, _n(p["n"]), _n(p["delivered"]), figure, asked, _ok(met)]
            )
    meta = report["meta"]
    title = (
        f"Partners ({meta['db']}, {WORKERS} async workers, outage {meta['sizes']['outage']:.0f} s"
    )
    title += f"; alone = {_n(base)}/s, the mean of the healthy runs"
    return _table(title + "; * stopped at the time limit)", header, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="all")
    parser.add_argument("--db", choices=["sqlite", "postgresql", "mysql"], default="postgresql")
    parser.add_argument("--quick", action="store_true", help="fewer intents, a 10 s outage")
    parser.add_argument("--outage", type=float, help="seconds the down partner is down")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    sizes = dict(SIZES["quick" if args.quick else "full"])
    if args.outage is not None:
        sizes["outage"] = args.outage
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.settings", BENCH_DB=args.db, BENCH_SYSTEM="intents"
    )
    os.environ.setdefault("BENCH_DB_PREFIX", "partners")  # its own database: bench_* are run.py's
    for name in ("BENCH_LIMITS", "BENCH_MAX_ATTEMPTS"):  # set per run, for the worker only
        os.environ.pop(name, None)
    from bench import settings as bench_settings
    from bench.suite import Suite, _create_database

    _create_database(bench_settings.VENDOR, bench_settings.NAME)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    suite = Suite({})
    # The healthy partners alone run first, and again last when others ran
    # between: the mean of the two is the others' baseline, so that neither
    # a cold first run nor a machine that got busier tilts the ratios.
    runs = {"healthy": [], "all": [(p, [p]) for p in BAD] + [("all", list(BAD))]}.get(
        args.scenario, [(args.scenario, [args.scenario])]
    )
    if runs:
        runs.append(("healthy", []))
    report: dict[str, Any] = {
        "meta": {
            "db": args.db,
            "quick": args.quick,
            "sizes": sizes,
            "workers": WORKERS,
            "scenario": args.scenario,
        },
        "runs": [],
    }
    for name, partners in [("healthy", []), *runs]:
        print(f"partners: {name}", file=sys.stderr, flush=True)
        try:
            report["runs"].append(run(suite, name, partners, sizes))
        except Exception as exc:  # one broken run must not hide the others
            report["runs"].append(
                {"run": name, "partners": partners, "error": f"{type(exc).__name__}: {exc}"}
            )
    alone = [
        r["healthy"]["per_s"] for r in report["runs"] if r["run"] == "healthy" and "healthy" in r
    ]
    report["baseline_per_s"] = sum(alone) / len(alone) if alone else None
    suite.reset()
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["baseline_per_s"] else 1


if __name__ == "__main__":
    sys.exit(main())
