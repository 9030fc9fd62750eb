"""When a pool that runs to an end is done: ``--drain``, ``--until-empty``, ``--timeout``.

A drain ends once a claim that looked at the whole claim index found nothing
due and every attempt the pool started has finished. What is scheduled for
later (a retry backing off, a ``next_at`` in the future) stays pending: that
suits a cron job working off what is due, but in CI it hides a failure behind
its first backoff. So the pool can also run until *empty*: no intent of its
kinds pending or running, scheduled ones included; it keeps polling through
the backoffs until they have run. A timeout bounds either: once it passes,
the pool stops as on SIGTERM and exits 1, naming what is left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import Error as DatabaseFailure

from django_intents.conf import get_settings
from django_intents.models import Intent
from django_intents.observability.backlog import read_backlog
from django_intents.rules.limits import limited_kinds, rates_of
from django_intents.worker import log
from django_intents.worker.outage import cause_text

if TYPE_CHECKING:
    from django_intents.worker.floor import ClaimFloor


class Drain:
    """Whether a pool may end now, and whether it ran out of time first.

    Called from the loop thread only.
    """

    def __init__(
        self,
        *,
        using: str,
        kinds: Sequence[str],
        due: bool,
        empty: bool,
        timeout: float | None,
    ) -> None:
        if timeout is not None and not (due or empty):
            raise ValueError("timeout bounds a drain: it needs drain or until_empty")
        if timeout is not None and not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self._using = using
        self._kinds = list(kinds)
        self._empty = empty
        self._timeout = timeout
        # A claim that finds nothing proves nothing is due only where no limit
        # (a cap, a rate, an order) holds intents back.
        settings = get_settings()
        held = {*limited_kinds(settings.limits, settings.targets), *rates_of(settings.targets)}
        self._limited = bool(held & set(kinds))
        self.enabled = due or empty
        # Only a drain ends on what a claim found; running empty asks the table.
        self.ends_on_claim = due and not empty
        self._deadline: float | None = None
        self._timed_out = False
        self._unrecorded = 0

    def describe(self) -> str:
        """How the start-up line names the mode: ``"draining"``, ``"until empty"`` or ``""``."""
        mode = "until empty" if self._empty else "draining" if self.enabled else ""
        return f"{mode}, timeout {self._timeout:g} s" if self._timeout is not None else mode

    def start(self) -> None:
        """Start the clock of the timeout."""
        if self._timeout is not None:
            self._deadline = time.monotonic() + self._timeout

    def done(self, claimed: int | None, held: int) -> bool:
        """Whether the pool may end, after a claim that took ``claimed`` with ``held`` claims held.

        ``claimed`` is 0 only when a claim over the whole index found nothing
        due; ``None`` proves nothing. Running empty asks the database itself,
        which also sees what is not due yet and what other pools hold.
        """
        if not self.enabled or held or claimed:
            return False
        kinds = ", ".join(self._kinds)
        if self._empty:
            active = Intent.objects.using(self._using).pending().filter(kind__in=self._kinds)
            if active.exists():
                return False
            log.info("drained: no intent of kinds %s is pending or running", kinds)
            return True
        if claimed is None:
            return False
        if self._limited and Intent.objects.db_manager(self._using).has_due(kinds=self._kinds):
            return False  # due, but held back by a limit: wait for a slot
        log.info("drained: no intent of kinds %s is due", kinds)
        return True

    def found_nothing(
        self, since: datetime | None, floors: Sequence[ClaimFloor], ring: Callable[[], None]
    ) -> int | None:
        """What a claim that found nothing proves: 0 when it looked at the whole
        index; ``None`` if it looked only above its floor (``floor.py``).

        A drain may end only when a claim that looked at the whole index found
        nothing, so the next turn of a draining pool makes a full one at once,
        in every group (the floors): only such a turn ends it.
        """
        if since is None:
            return 0
        if self.ends_on_claim:
            for floor in floors:
                floor.rescan()
            ring()
        return None

    def overdue(self) -> bool:
        """True once, when the timeout has passed: the pool must stop now."""
        if self._deadline is None or self._timed_out or time.monotonic() < self._deadline:
            return False
        self._timed_out = True
        log.warning("timeout of %g s reached before the drain ended; stopping", self._timeout)
        return True

    def wake_at(self) -> float:
        """When the loop must wake to notice the timeout (``inf``: never)."""
        if self._deadline is None or self._timed_out:
            return math.inf
        return self._deadline

    def unrecorded(self, count: int = 1) -> None:
        """Count attempts whose result the database never took: a drain must not end with 0."""
        self._unrecorded += count

    def status(self) -> int:
        """The exit status of a pool that stopped by itself, saying why when it is 1.

        1 when a result could not be recorded (its intent stays running until
        the lease expires), or after a timeout, naming what is left.

        Read after the release, so an intent that was running counts where it
        ended: pending again, or still running elsewhere.
        """
        lost = self.enabled and self._unrecorded > 0
        if lost:
            log.error(
                "%d attempt result(s) could not be recorded; those intents stay running "
                "until their leases expire, then run again",
                self._unrecorded,
            )
        if not self._timed_out:
            return 1 if lost else 0
        try:
            left = [k for k in read_backlog(using=self._using).kinds if k.kind in self._kinds]
        except DatabaseFailure as exc:
            log.error(
                "timed out after %g s; what is left could not be read (%s)",
                self._timeout,
                cause_text(exc),
            )
            return 1
        log.error(
            "timed out after %g s with %d intent(s) of the pool's kinds still pending or "
            "running: %s",
            self._timeout,
            sum(k.active for k in left),
            ", ".join(f"{k.kind} ({k.pending} pending, {k.running} running)" for k in left)
            or "none (they finished meanwhile)",
        )
        return 1
