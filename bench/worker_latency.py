"""Enqueue -> handler start latency of an idle ``run_intent_workers`` pool.

    INTENTS_TEST_DB=postgresql python bench/worker_latency.py --n 50
    INTENTS_TEST_DB=sqlite python bench/worker_latency.py --n 50

Creates a scratch database (``INTENTS_TEST_DB_SUFFIX``, default ``_wbench``),
starts one real worker process with the ``test.stamp`` handler, and enqueues
one intent at a time, ``--gap`` seconds apart, so the pool is idle before each.
The handler writes ``time.time()`` as its first act; the latency is that minus
the time just before the enqueue call (autocommit, so it includes the commit).
On PostgreSQL the pool wakes on NOTIFY; elsewhere it polls every POLL_INTERVAL.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("INTENTS_TEST_DB_SUFFIX", "_wbench")
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50, help="intents to time (default 50)")
    parser.add_argument("--gap", type=float, default=0.3, help="idle seconds before each")
    parser.add_argument("--conn-max-age", default="0", help="CONN_MAX_AGE of the worker")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection

    from django_intents.models import Intent
    from tests.testapp.models import Effect

    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    log = (ROOT / ".tmp" / "worker_latency.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "run_intent_workers", "--kinds", "test.stamp"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
            "INTENTS_TEST_CONN_MAX_AGE": args.conn_max_age,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    latencies: list[float] = []
    try:
        time.sleep(2.0)  # start-up, first claim
        for i in range(args.n):
            time.sleep(args.gap)
            before = time.time()
            id = Intent.objects.enqueue("test.stamp", f"latency-{i}", "bench")
            deadline = time.monotonic() + 10
            while not (notes := Effect.objects.filter(intent_id=id).values_list("note", flat=True)):
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"intent {i} did not start within 10 s; see .tmp/worker_latency.log"
                    )
                time.sleep(0.001)
            latencies.append((float(notes[0]) - before) * 1000)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        log.close()
        connection.creation.destroy_test_db(
            connection.settings_dict["NAME"], verbosity=0, keepdb=False
        )

    latencies.sort()
    print(
        f"{connection.vendor}: enqueue -> handler start over {len(latencies)} intents, idle pool: "
        f"median {statistics.median(latencies):.1f} ms, "
        f"p90 {latencies[int(len(latencies) * 0.9) - 1]:.1f} ms, "
        f"min {latencies[0]:.1f} ms, max {latencies[-1]:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
