"""Chaos soak: crash, stop and disconnect workers at random, then prove nothing went wrong.

    python bench/chaos.py [--db sqlite|postgresql|mysql] [--intents 5000] [--duration 90]
                          [--processes 4] [--threads 4] [--lease 2] [--seed N]

N intents of kind ``chaos`` are enqueued with their ``next_at`` spread over the
fault window, so work arrives while the faults happen. K ``run_intent_workers``
processes with a short lease run them; the handler (``bench/chaosapp``)
records every execution with its claim token in a table of its own, in its own
transaction, works for a while (a few intents for longer than the lease), and
completes half of the intents inside ``attempt.atomic()`` with a
``Completion`` row. Meanwhile a fault loop, every second or so, does one of:

- SIGKILL a worker process (and start a replacement);
- SIGTERM one (it must exit 0 after its grace period; a replacement starts);
- SIGSTOP one for longer than the lease, then SIGCONT it: its claims are taken
  over while it sleeps, and whatever it says when it wakes must be fenced;
- terminate database connections from the server side (PostgreSQL,
  MariaDB/MySQL): the workers must reconnect.

One live worker at a time runs with its clock ``--skew`` seconds off the
database's (ahead, then behind in its replacement; ``bench/skew.py``): leases
are judged by the database's clock, so it neither steals live leases nor
keeps expired ones, and the verdict below holds with it.

Then the faults stop, the queue drains, every worker gets SIGTERM, and the
rows are checked: every intent completed, none lost or stuck; no intent
completed by a claim token other than its last; an ``attempt.atomic()``
completion exactly once per intent; no claim that ran its handler twice; and
duplicate executions no more than the attempts interrupted, which are
themselves bounded by the faults. The report fits on one screen; the exit
status is 1 on any violation.

``tests/test_chaos.py`` runs a 30-second version in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KIND = "chaos"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "mysql"], default="sqlite")
    parser.add_argument("--intents", type=int, default=5000)
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of faults")
    parser.add_argument("--processes", type=int, default=4, help="worker processes")
    parser.add_argument("--threads", type=int, default=4, help="--workers of each process")
    parser.add_argument("--lease", type=float, default=2.0, help="seconds")
    parser.add_argument("--grace", type=float, default=1.0, help="--grace of each process")
    parser.add_argument("--interval", type=float, default=1.0, help="mean seconds between faults")
    parser.add_argument(
        "--skew",
        type=int,
        default=30,
        help="seconds one worker's clock is off the database's, ahead then behind (0: none)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--suffix", default="", help="database name suffix, for parallel runs")
    return parser.parse_args(argv)


# -- the database ------------------------------------------------------------------


def recreate_database(settings: Any) -> None:
    """Drop and create the soak's own database: a run never sees an earlier one's rows."""
    db = settings.DATABASES["default"]
    if settings.VENDOR == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(db["NAME"] + suffix).unlink(missing_ok=True)
    elif settings.VENDOR == "postgresql":
        import psycopg
        from psycopg import sql

        params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": "postgres"}
        with psycopg.connect(**params, autocommit=True) as conn:
            name = sql.Identifier(db["NAME"])
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    else:
        import MySQLdb

        conn = MySQLdb.connect(
            host=db["HOST"], port=int(db["PORT"]), user=db["USER"], password=db["PASSWORD"]
        )
        try:
            name = db["NAME"].replace("`", "``")
            cursor = conn.cursor()
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        finally:
            conn.close()


def enqueue(args: argparse.Namespace, rng: random.Random) -> None:
    from django.utils import timezone

    from django_intents.models import Intent

    now = timezone.now()
    items = []
    for n in range(args.intents):
        long = rng.random() < 0.03  # outlives the lease: only renewals keep it
        seconds = args.lease * rng.uniform(1.2, 2.0) if long else rng.uniform(0.02, 0.2)
        items.append(
            {
                "kind": KIND,
                "event_id": f"chaos-{n}",
                "target": "chaos",
                "payload": {
                    "seconds": round(seconds, 3),
                    "patient": rng.random() < 0.5,
                    "atomic": rng.random() < 0.5,
                },
                "next_at": now + timedelta(seconds=rng.uniform(0, args.duration * 0.8)),
            }
        )
    Intent.objects.enqueue_many(items, now=now)


def server_connections() -> list[int]:
    """The other sessions on the soak's database (the workers'), by server id."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        else:
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        return [row[0] for row in cursor.fetchall()]


def terminate_connection(server_id: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [server_id])
        else:
            try:
                cursor.execute("KILL CONNECTION %s", [server_id])
            except Exception as exc:  # it may have gone by itself in the meantime
                if "Unknown thread id" not in str(exc):
                    raise


# -- the workers ---------------------------------------------------------------------


@dataclass(eq=False)
class Worker:
    number: int
    proc: subprocess.Popen[bytes]
    log: Path
    fate: str = "running"  # then paused, killed, terminating, stopping, hung; done once judged
    skew: int = 0  # seconds its clock is off the database's
    wake_at: float = 0.0
    term_deadline: float = 0.0

    @property
    def ready(self) -> bool:
        """Started up: it said so, and its SIGTERM handler is in place."""
        with self.log.open("rb") as log:
            return b" starting " in log.read(8192)

    @property
    def label(self) -> str:
        return f"worker {self.number} (pid {self.proc.pid})"

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.killpg(self.proc.pid, signum)


@dataclass
class Soak:
    args: argparse.Namespace
    rng: random.Random
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    exits: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    connections_terminated: int = 0
    skewed: int = 0  # workers started with a skewed clock
    drained_in: float | None = None
    replacing: bool = True  # a worker that dies on its own is replaced until the final stop

    @property
    def logs(self) -> Path:
        """One directory per database and suffix: parallel soaks keep their logs apart."""
        path = ROOT / ".tmp" / "chaos" / f"{self.args.db}{self.args.suffix}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start_worker(self) -> Worker:
        number = len(self.workers) + 1
        log = self.logs / f"worker-{number}.log"
        args = self.args
        command = [
            sys.executable, "-m", "django", "run_intent_workers", "--kinds", KIND,
            "--workers", str(args.threads), "--lease", str(args.lease),
            "--grace", str(args.grace),
        ]  # fmt: skip
        skew, env = self.skew()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(number, proc, log, skew=skew)
        self.workers.append(worker)
        return worker

    def skew(self) -> tuple[int, dict[str, str]]:
        """One live worker at a time has a skewed clock: ahead, then behind, by turns."""
        from bench.skew import skewed_env

        alive = self.live("running", "paused", "terminating", "stopping")
        if not self.args.skew or any(w.skew for w in alive):
            return 0, self.env
        skew = self.args.skew if self.skewed % 2 == 0 else -self.args.skew
        extra = skewed_env(self.args.db, skew)
        if extra is None:
            raise SystemExit("--skew needs a C compiler (bench/skew.py); --skew 0: none")
        self.skewed += 1
        return skew, {**self.env, **extra}

    def live(self, *fates: str) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None and w.fate in fates]

    def run(self) -> None:
        for _ in range(self.args.processes):
            self.start_worker()
        deadline = time.monotonic() + self.args.duration
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.5, 1.5) * self.args.interval)
            self.reap()
            self.fault()
        for worker in self.live("paused"):
            worker.send(signal.SIGCONT)
            worker.fate = "running"
        self.drain()
        started = time.monotonic()
        while not all(w.ready for w in self.live("running")) and time.monotonic() < started + 30:
            time.sleep(0.1)
        for worker in self.live("running"):
            worker.send(signal.SIGTERM)
            worker.fate, worker.term_deadline = "stopping", time.monotonic() + 30
        while self.live("stopping", "terminating"):
            time.sleep(0.1)
            self.reap()
        self.reap()

    def fault(self) -> None:
        """Apply one fault, chosen at random among those possible right now."""
        running = self.live("running")
        # Before start-up ends, Python's default SIGTERM action would kill a worker outright.
        ready = [worker for worker in running if worker.ready]
        choices = ["kill"] if running else []
        if len(running) > 1:
            choices.append("pause")
        if len(ready) > 1:
            choices.append("term")
        if self.args.db != "sqlite":
            choices.append("disconnect")
        if not choices:
            return
        kind = self.rng.choice(choices)
        if kind == "disconnect":
            ids = server_connections()
            chosen = self.rng.sample(ids, k=min(len(ids), self.rng.randint(1, 4)))
            for server_id in chosen:
                terminate_connection(server_id)
            self.connections_terminated += len(chosen)
        elif kind == "kill":
            worker = self.rng.choice(running)
            worker.send(signal.SIGKILL)
            worker.fate = "killed"
            self.start_worker()
        elif kind == "term":
            worker = self.rng.choice(ready)
            worker.send(signal.SIGTERM)
            worker.fate = "terminating"
            worker.term_deadline = time.monotonic() + self.args.grace + 30
            self.start_worker()
        else:
            worker = self.rng.choice(running)
            worker.send(signal.SIGSTOP)
            worker.fate = "paused"
            worker.wake_at = time.monotonic() + self.args.lease * self.rng.uniform(1.2, 2.5)
        self.faults[kind] += 1

    def reap(self) -> None:
        """Wake paused workers that slept long enough; judge every worker that exited."""
        now = time.monotonic()
        for worker in self.live("paused"):
            if now >= worker.wake_at:
                worker.send(signal.SIGCONT)
                worker.fate = "running"
        for worker in self.workers:
            code = worker.proc.poll()
            if code is None:
                if worker.fate in ("terminating", "stopping") and now > worker.term_deadline:
                    self.violations.append(f"{worker.label} ignored SIGTERM; killed")
                    worker.send(signal.SIGKILL)
                    worker.fate = "hung"
                continue
            if worker.fate == "done":
                continue
            if worker.fate == "killed" and code == -signal.SIGKILL:
                self.exits["SIGKILLed"] += 1
            elif worker.fate in ("terminating", "stopping") and code == 0:
                self.exits["exit 0 after SIGTERM"] += 1
            elif worker.fate != "hung":
                tail = worker.log.read_text(errors="replace").splitlines()[-5:]
                self.violations.append(
                    f"{worker.label} exited with {code} ({worker.fate}): " + " | ".join(tail)
                )
                self.exits["unexpected"] += 1
                if worker.fate == "running" and self.replacing:
                    self.start_worker()
            worker.fate = "done"

    def drain(self) -> None:
        """Wait until every intent is finished, replacing any worker that dies meanwhile."""
        from django.db import connection

        from django_intents.models import Intent

        started = time.monotonic()
        limit = started + self.args.lease * 5 + 120
        while time.monotonic() < limit:
            self.reap()
            try:
                if not Intent.objects.in_state("pending").exists() and not (
                    Intent.objects.in_state("running").exists()
                ):
                    self.drained_in = time.monotonic() - started
                    break
            except Exception:  # our own connection may have been terminated above
                connection.close()
            time.sleep(0.2)
        self.replacing = False


# -- the verdict --------------------------------------------------------------------------


def verify(soak: Soak) -> list[str]:
    """Check the rows; return the report's lines (violations are added to ``soak``)."""
    from bench.chaosapp.models import Completion, Execution
    from django_intents.models import Intent

    args, violations = soak.args, soak.violations
    intents = {
        i: (s, a, p)
        for i, s, a, p in Intent.objects.values_list("id", "state", "attempts", "payload")
    }
    states = Counter(state for state, _, _ in intents.values())
    runs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for intent_id, token, attempt in Execution.objects.values_list(
        "intent_id", "claim_token", "attempt"
    ):
        runs[intent_id].append((attempt, token))
    completions: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for intent_id, token, attempt, how in Completion.objects.values_list(
        "intent_id", "claim_token", "attempt", "how"
    ):
        completions[intent_id, how].append((attempt, token))

    unfinished = len(intents) - states["completed"]
    if len(intents) != args.intents:
        violations.append(f"{args.intents} intents enqueued, {len(intents)} in the table")
    if unfinished:
        violations.append(f"{unfinished} intents not completed: {dict(states)}")
    executions = sum(len(r) for r in runs.values())
    claims = sum(attempts for _, attempts, _ in intents.values())
    stale = unobserved = twice = not_once = 0
    for id, (state, attempts, payload) in intents.items():
        tokens = [token for _, token in runs[id]]
        if len(tokens) != len(set(tokens)):
            twice += 1
        last = [token for attempt, token in runs[id] if attempt == attempts]
        if state != "completed":
            continue
        if not last:
            violations.append(f"{id[:12]}: completed, but its last claim ({attempts}) never ran")
            continue
        how = "atomic" if payload["atomic"] else "worker"
        done = completions[id, how]
        if how == "atomic" and len(done) != 1:
            not_once += 1
            violations.append(f"{id[:12]}: {len(done)} atomic completions, not exactly one")
        if how == "worker" and len(done) > 1:
            violations.append(f"{id[:12]}: {len(done)} claims reported success")
        if how == "worker" and not done:
            unobserved += 1
        stale += sum(1 for _, token in done if token != last[0])
    if stale:
        violations.append(f"{stale} intents completed by a claim token other than their last")
    if twice:
        violations.append(f"{twice} intents had a claim that ran the handler twice")
    duplicates = executions - states["completed"]
    interrupted = claims - len(intents)
    # Claims that never ran their handler: queued in a pool (its local queue,
    # demand.py) when it was killed. A stop or a stall gives such a claim back
    # with its attempt, so those leave no trace in ``attempts``.
    unstarted = sum(
        attempts - len({attempt for attempt, _ in runs[id]})
        for id, (_, attempts, _) in intents.items()
    )
    disruptions = soak.faults["kill"] + soak.faults["term"] + soak.faults["pause"]
    bound = args.threads * (disruptions + soak.connections_terminated)
    if executions > claims:
        violations.append(f"{executions} executions for {claims} claims")
    if interrupted > bound:
        violations.append(
            f"{interrupted} interrupted attempts, more than the faults explain ({bound})"
        )

    faults = soak.faults
    exits = ", ".join(f"{n} {what}" for what, n in sorted(soak.exits.items())) or "none"
    drained = "did not drain" if soak.drained_in is None else f"drained in {soak.drained_in:.1f} s"
    return [
        f"chaos soak on {args.db}: {args.intents} intents, {args.processes} processes x "
        f"{args.threads} workers, lease {args.lease:g} s, {args.duration:g} s of faults "
        f"(seed {args.seed})",
        f"faults:      {faults['kill']} SIGKILL, {faults['term']} SIGTERM, {faults['pause']} "
        f"SIGSTOP/SIGCONT, {faults['disconnect']} disconnects "
        f"({soak.connections_terminated} connections terminated)",
        f"intents:     {states['completed']} completed, {states['cancelled']} cancelled, "
        f"{states['pending']} pending, {states['running']} running; lost: {unfinished}",
        f"executions:  {executions} for {states['completed']} completed intents: "
        f"{duplicates} duplicates",
        f"claims:      {claims}: {interrupted} interrupted attempts (bound: {args.threads} "
        f"workers x {disruptions + soak.connections_terminated} disruptions = {bound}); "
        f"{unstarted} of them never started (queued claims)",
        f"completions: {stale} by a stale claim; atomic exactly once: "
        f"{'yes' if not not_once else f'NO ({not_once} intents)'}; "
        f"{unobserved} worker completions unobserved (killed before the receiver ran)",
        f"workers:     {len(soak.workers)} started; exits: {exits}; {drained}",
        f"clocks:      {soak.skewed} of them, one at a time, with a clock {args.skew} s "
        "off the database's, ahead and behind by turns",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(args.seed)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.chaos_settings",
        "CHAOS_DB": args.db,
        "CHAOS_DB_SUFFIX": args.suffix,
        "CHAOS_LEASE": str(args.lease),
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))

    import django

    from bench import chaos_settings

    recreate_database(chaos_settings)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    enqueue(args, rng)
    soak = Soak(args, rng, env)
    started = time.monotonic()
    try:
        soak.run()
    finally:
        for worker in soak.live("running", "paused", "terminating", "stopping"):
            worker.send(signal.SIGKILL)
    from django.db import connection

    connection.close()
    lines = verify(soak)
    logs = soak.logs.relative_to(ROOT)
    lines.append(f"time:        {time.monotonic() - started:.0f} s; worker logs in {logs}/")
    print("\n".join(lines))
    if soak.violations:
        print(f"\nVIOLATIONS ({len(soak.violations)}):")
        for violation in soak.violations[:20]:
            print(f"  - {violation}")
        return 1
    print("\nOK: nothing lost, nothing stuck, no stale completion")
    return 0


if __name__ == "__main__":
    sys.exit(main())
