import atexit
import os
import time
from pathlib import Path

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"

    def ready(self) -> None:
        if os.environ.get("BENCH_CLAIM_TIMES"):
            time_claims(Path(os.environ["BENCH_CLAIM_TIMES"]))


def time_claims(base: Path) -> None:
    """Time every ``claim_many`` of this process; write the seconds to ``base.<pid>`` at exit.

    For ``bench/mvcc.py``: a claim's latency as the pool sees it (the statement's
    round trip and the instances it builds), with no server extension.
    """
    from django_intents.managers import IntentManager

    claim_many = IntentManager.claim_many
    durations: list[float] = []

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        try:
            return claim_many(self, *args, **kwargs)
        finally:
            durations.append(time.perf_counter() - began)

    IntentManager.claim_many = timed  # type: ignore[method-assign]
    atexit.register(
        lambda: Path(f"{base}.{os.getpid()}").write_text("\n".join(map(repr, durations)))
    )
