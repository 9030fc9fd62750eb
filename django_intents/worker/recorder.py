"""Every result of a pool recorded by its loop, in batches, on the pool's own connection.

Worker threads and coroutines only hand their claims back with an outcome
(``execution.py``); each turn the loop records all of them at once: the
successes in one fenced ``complete_many``, the failures, ``Stop``s and
releases in one fenced ``finish_many``. The pool knows each claim's attempt
number (the claim counted it, and the token fences it), so it decides retry
or cancellation, and the backoff, without asking the database. A busy pool
thus costs the database about two statements per turn however many
handlers finished, and a pool whose every handler fails costs no more than
one whose every handler succeeds.

Where the database takes several writers at once (PostgreSQL, MariaDB), a
writer thread with its own connection writes each batch while the loop
claims the next intents, so a pool's round trips overlap instead of adding
up: the loop's connection, the writer's and the LISTEN one are all a pool
ever holds. On SQLite, one writer at a time, the loop writes them itself.

Only the loop thread calls the recorder; its writer thread shares nothing
with the loop but the two queues that carry a batch there and back. The loop
thread counts each result in ``tally`` (``tally.py``) as it learns it.

A failure's traceback (its tail) is written with its error, in the same
fenced statement, to ``last_traceback``; the log shows it at the first
failure of each kind and exception type, and reminds of it after that.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import Error as DatabaseFailure
from django.db import connections, transaction

from django_intents.conf import get_settings
from django_intents.managers import IntentManager
from django_intents.rules.batches import INSERT_BATCH
from django_intents.rules.limits import limited_kinds
from django_intents.rules.retries import counted, retry_at
from django_intents.rules.states import State
from django_intents.rules.targets import BLOCKING, Event
from django_intents.signals import Outcome
from django_intents.store.base import Ending
from django_intents.store.claims import Claims
from django_intents.store.clock import server_now
from django_intents.store.targets import TargetEvent
from django_intents.worker import log
from django_intents.worker.execution import Claim, send_finished
from django_intents.worker.outage import one_line
from django_intents.worker.tally import Tally, column

if TYPE_CHECKING:
    from django_intents.models import Intent


# More failures than this of one kind with one error, in one batch, are logged as one line.
BURST = 5

# A recorded result and the column it counts in (``tally.column``).
Result = tuple[Claim, Outcome, str]
Written = tuple[list[Result], DatabaseFailure | None]


class Recorder:
    """The results handed back and not yet recorded."""

    def __init__(
        self,
        manager: IntentManager,
        *,
        max_attempts: int | None,
        threaded: bool = False,
        wake: Callable[[], None],
    ) -> None:
        self._manager = manager
        self._max_attempts = max_attempts
        self.threaded = threaded  # the pool decides once it knows its database
        self._wake = wake
        self._waiting: list[Claim] = []
        # Successes of kinds with LIMITS or ordered, for the claim of this turn to complete
        # (``claiming``): handed back since the last ``record``, and before it;
        # only while the last such claim found a limit near (``Claims.bound``).
        settings = get_settings()
        self._limited = limited_kinds(settings.limits, settings.targets)
        self._breakers = frozenset(
            kind for kind, policy in settings.targets.items() if policy.breaker is not None
        )
        self._riding = True
        self._fresh: list[Claim] = []
        self._riders: list[Claim] = []
        self._in_flight: list[Claim] | None = None  # the batch the writer thread has
        self._inbox: queue.SimpleQueue[list[Claim] | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[Written] = queue.SimpleQueue()
        # The (kind, target) pairs a written batch held or opened, for the loop.
        self._blocked: queue.SimpleQueue[set[tuple[str, str]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.tally = Tally()
        # (kind, exception type) whose traceback the log has shown, to show each once;
        # only the thread that writes (the writer's, or the loop's without one) uses it.
        self._shown: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        held = len(self._fresh) + len(self._riders)
        return held + len(self._waiting) + len(self._in_flight or ())

    def add(self, claim: Claim) -> Outcome | None:
        """Take a finished claim; return its outcome at once when there is nothing to record."""
        outcome = self._settled(claim)
        if outcome is not None:
            self.tally.add(claim.intent.kind, column(outcome))
            send_finished(claim, outcome)
        return outcome

    def _settled(self, claim: Claim) -> Outcome | None:
        attempt = claim.attempt
        if attempt.completed:
            if claim.outcome is not Outcome.SUCCESS:
                log.warning(
                    "%s: failed after attempt.atomic() completed it: %s",
                    claim.name,
                    one_line(claim.cause),
                )
            if claim.intent.kind in self._breakers:
                self._completed_in_handler(claim)
            return Outcome.SUCCESS
        if attempt.lost:
            if claim.outcome is not Outcome.FENCED or claim.cause:
                log.info("%s: result dropped, the claim was lost", claim.name)
            return Outcome.FENCED
        limited = claim.intent.kind in self._limited
        rides = limited and self._riding and self.threaded and claim.outcome is Outcome.SUCCESS
        (self._fresh if rides else self._waiting).append(claim)
        return None

    def _completed_in_handler(self, claim: Claim) -> None:
        """A success the handler's ``attempt.atomic()`` wrote: it resets its target's count
        of failures (SPEC §14) like any other. Written here, on the loop's connection, as
        it is rare (a kind with a breaker whose handler completes its own intent); a
        failure to write it leaves the count as it was and is logged."""
        intent = claim.intent
        event = TargetEvent(intent.kind, intent.target, Event.SUCCESS, intent.id)
        try:
            self._manager.record_target_events([event])
        except DatabaseFailure as exc:
            log.warning("%s: its target's health not written: %s", claim.name, one_line(str(exc)))

    def record(self, *, wait: float = 0.0) -> list[tuple[Claim, Outcome]]:
        """Return the results recorded since the last call; hand over the next batch.

        With a writer thread (``threaded``) a batch is written while the loop
        claims; without one (SQLite, one writer at a time) it is written here.
        ``wait`` bounds how long to wait for a batch in flight. Raises the
        database's error with that batch kept for the next call.
        """
        # Only without a writer thread is a batch written here, and then none is in flight.
        return self._counted(self._take_written(wait) + self._hand_over())

    def _hand_over(self) -> list[Result]:
        """Hand the next batch to the writer thread, or write it here: what was written."""
        # Kept through a turn whose claims did not take them: the writer does.
        self._waiting += self._riders
        self._riders, self._fresh = self._fresh, []
        if self._in_flight is None and self._waiting:
            batch, self._waiting = _distinct(self._waiting)
            if not self.threaded:
                try:
                    return self._write(batch)
                except BaseException:
                    self._waiting = batch + self._waiting
                    raise
            self._start_thread()
            self._in_flight = batch
            self._inbox.put(batch)
        return []

    def _counted(self, results: list[Result]) -> list[tuple[Claim, Outcome]]:
        """Count ``results`` in the tally (on the loop thread); return them as pairs."""
        for claim, _, name in results:
            self.tally.add(claim.intent.kind, name)
        return [(claim, outcome) for claim, outcome, _ in results]

    def claiming(
        self, claim: Callable[[list[tuple[str, str]]], Claims[Intent]], *, ride: bool
    ) -> tuple[Claims[Intent], list[tuple[Claim, Outcome]]]:
        """Run ``claim``; with ``ride``, have it complete this turn's successes of
        kinds with ``LIMITS`` first.

        Written by the writer thread, a result frees its target's place under
        ``LIMITS`` some milliseconds after the handler returned, and the next
        claim sees it only a round trip after that, so each place stays taken
        longer than its delivery (docs/benchmarks.md, "A place frees for the
        claim that follows"). Completed by the claim (``claims.Riders``),
        the place is free for that very claim. A pool with a writer thread
        only (``threaded``); the successes of a turn whose claims do not take
        them, or fail, go to the writer in the next turn. While the claims
        find room for all they ask (not ``bound``), no place is short, and the
        writer takes the successes at once, beside the claim: completed in
        it, they would lengthen the loop's turn.
        """
        riders = self._take_riders() if ride else []
        try:
            claimed = claim([(c.intent.id, c.intent.claim_token) for c in riders])
        except BaseException:
            self._waiting = riders + self._waiting
            raise
        if ride:
            self._riding = claimed.bound
        completed = set(claimed.completed)
        results: list[Result] = []
        for rider in riders:
            outcome = Outcome.SUCCESS if rider.intent.id in completed else Outcome.FENCED
            if outcome is Outcome.FENCED:
                log.info("%s: result dropped, the claim was lost", rider.name)
            results.append((rider, outcome, column(outcome)))
            send_finished(rider, outcome)
        return claimed, self._counted(results)

    def _take_riders(self) -> list[Claim]:
        """This turn's riders, one per intent and none the writer has, up to a batch."""
        taken = {claim.intent.id for claim in self._in_flight or ()}
        riders: list[Claim] = []
        for claim in self._riders:
            ok = claim.intent.id not in taken and len(riders) < INSERT_BATCH
            (riders if ok else self._waiting).append(claim)
            taken.add(claim.intent.id)
        self._riders = []
        return riders

    def newly_blocked(self) -> set[tuple[str, str]]:
        """The (kind, target) pairs the batches written since the last call held or opened:
        the loop gives back the claims of them still waiting for a thread."""
        blocked: set[tuple[str, str]] = set()
        while True:
            try:
                blocked |= self._blocked.get_nowait()
            except queue.Empty:
                return blocked

    def finish(self, timeout: float) -> list[tuple[Claim, Outcome]]:
        """Record everything handed back so far, waiting for it up to ``timeout`` seconds."""
        until = time.monotonic() + timeout
        results: list[tuple[Claim, Outcome]] = []
        while self and time.monotonic() < until:
            results += self.record(wait=max(until - time.monotonic(), 0.0))
        return results

    def stop(self) -> None:
        """End the writer thread; a batch it is still writing finishes on its own."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(1.0)

    # -- the writer ----------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="intents-recorder", daemon=True
            )
            self._thread.start()

    def _serve(self) -> None:
        """The writer thread: write each batch handed over, on its own connection."""
        try:
            while (batch := self._inbox.get()) is not None:
                try:
                    self._outbox.put((self._write(batch), None))
                except DatabaseFailure as exc:
                    with contextlib.suppress(DatabaseFailure):
                        connections[self._manager.db].close()
                    self._outbox.put(([], exc))
                self._wake()
        finally:
            connections.close_all()

    def _take_written(self, wait: float) -> list[Result]:
        if self._in_flight is None:
            return []
        try:
            written, error = self._outbox.get(timeout=wait) if wait else self._outbox.get_nowait()
        except queue.Empty:
            return []
        batch, self._in_flight = self._in_flight, None
        if error is not None:
            self._waiting = batch + self._waiting
            raise error
        return written

    def _write(self, batch: list[Claim]) -> list[Result]:
        """Record one batch of distinct intents in one or two fenced statements."""
        successes = [c for c in batch if c.outcome is Outcome.SUCCESS]
        others = [c for c in batch if c.outcome is not Outcome.SUCCESS]
        # The pool's loop keeps the clock read; this thread need not ask.
        now = server_now(self._manager.db, read=False)
        endings = [self._ending(claim, now) for claim in others]
        done: set[str] = set()
        events: list[TargetEvent] = []
        changes: list[tuple[str, str, str, str]] = []
        health = [c for c in batch if self._tells_health(c)]
        both = (successes and endings) or health
        with transaction.atomic(using=self._manager.db) if both else contextlib.nullcontext():
            if successes:
                pairs = [(c.intent.id, c.intent.claim_token) for c in successes]
                done.update(self._manager.complete_many(pairs, now=now))
            if endings:
                done.update(self._manager.finish_many(endings, now=now))
            # With the results they come from: a breaker's count never runs ahead of them.
            events = [_target_event(c) for c in health if c.intent.id in done]
            changes = self._manager.record_target_events(events, now=now)
        blocked = {(e.kind, e.target) for e in events if e.event == Event.HOLD}
        blocked |= {(kind, target) for kind, target, state, _ in changes if state in BLOCKING}
        if blocked:
            self._blocked.put(blocked)
        results: list[Result] = []
        failed: list[tuple[Claim, Ending]] = []
        for claim, ending in [*((c, None) for c in successes), *zip(others, endings, strict=True)]:
            outcome = self._recorded(claim, ending, now) if claim.intent.id in done else None
            if outcome is None:
                log.info("%s: result dropped, the claim was lost", claim.name)
                outcome = Outcome.FENCED
            elif outcome in (Outcome.ERROR, Outcome.TIMEOUT) and ending is not None:
                failed.append((claim, ending))
            cancelled = ending is not None and ending.state == State.CANCELLED
            results.append((claim, outcome, column(outcome, cancelled=cancelled)))
            send_finished(claim, outcome)
        self._log_failures(failed, now)
        return results

    def _tells_health(self, claim: Claim) -> bool:
        """Whether the claim's result says something of its target (SPEC §14): any
        result of a kind with a breaker, a hold of any kind."""
        return claim.intent.kind in self._breakers or (
            claim.outcome is Outcome.SNOOZED and claim.hold
        )

    def _ending(self, claim: Claim, now: datetime) -> Ending:
        """The transition a failure, a ``Stop`` or a handler given up at shutdown ends with."""
        intent = claim.intent
        id, token = intent.id, intent.claim_token
        if claim.outcome is Outcome.FENCED:
            # ClaimLost while the claim still holds: the handler gave up at shutdown.
            return Ending(id, token, State.PENDING, next_at=now)
        # Written with the error it goes with: "" where the error has no traceback (a Stop).
        trace = None if claim.cause is None else claim.traceback or ""
        if claim.outcome is Outcome.SNOOZED:
            due = claim.due or now
            return Ending(id, token, State.PENDING, due, claim.cause, snooze=True, traceback=trace)
        stopped = claim.outcome is Outcome.STOPPED
        next_at = None if stopped else retry_at(id, counted(intent), self._max_attempts, now)
        if next_at is None:
            error = claim.cause or ""
            return Ending(id, token, State.CANCELLED, error=error, traceback=trace or "")
        return Ending(id, token, State.PENDING, next_at=next_at, error=claim.cause, traceback=trace)

    def _recorded(self, claim: Claim, ending: Ending | None, now: datetime) -> Outcome:
        """Say in the log how a recorded result ended; return its outcome.

        Failures are told by ``_log_failures``, once the whole batch is known.
        """
        outcome = claim.outcome or Outcome.ERROR
        if outcome is Outcome.SNOOZED and ending is not None:
            due = ending.next_at.isoformat(timespec="seconds") if ending.next_at else "now"
            log.info("%s: snoozed until %s: %s", claim.name, due, one_line(claim.cause))
        elif outcome is Outcome.STOPPED:
            log.warning(
                "%s: stopped by its handler, cancelled: %s", claim.name, one_line(claim.cause)
            )
        elif outcome is Outcome.FENCED:
            log.info("%s: handler stopped for shutdown; released, due now", claim.name)
        return outcome

    def _log_failures(self, failed: list[tuple[Claim, Ending]], now: datetime) -> None:
        """A line per failure, but a burst of one kind failing alike as one line.

        When a partner goes down, every delivery to it fails with the same
        error at once; a thousand identical lines bury the rest of the log and
        cost the pool more than recording the failures does. Up to ``BURST``
        alike in one batch are logged one by one; more as one line that counts
        them and names the first few.
        """
        alike: dict[tuple[str, str], list[tuple[Claim, Ending]]] = {}
        for claim, ending in failed:
            alike.setdefault((claim.intent.kind, one_line(claim.cause)), []).append((claim, ending))
        for (kind, cause), group in alike.items():
            if len(group) <= BURST:
                for claim, ending in group:
                    after, trace = self._then(ending, now), self._traceback(claim)
                    log.warning("%s: failed: %s; %s%s", claim.name, cause, after, trace)
                continue
            retries = [at for _, ending in group if (at := _retry_at(ending)) is not None]
            waits = [(at - now).total_seconds() for at in retries]
            cancelled = len(group) - len(waits)
            then = [f"{len(waits)} retry in {min(waits):.0f}-{max(waits):.0f} s"] if waits else []
            if cancelled:
                then.append(f"{cancelled} cancelled, MAX_ATTEMPTS ({self._max_attempts}) reached")
            first = ", ".join(claim.intent.id[:12] for claim, _ in group[:BURST])
            log.warning(
                "%s: %d attempts failed alike: %s; %s (first: %s)%s",
                kind,
                len(group),
                cause,
                "; ".join(then),
                first,
                self._traceback(group[0][0]),
            )

    def _traceback(self, claim: Claim) -> str:
        """What a failure's warning ends with: the traceback the first time its kind
        fails with its exception type, a reminder of it after that.

        At default verbosity, and once: the traceback says where a handler
        breaks, and a partner down for an hour must not fill the log with it.
        The admin shows the last one of each intent (``last_traceback``); with
        DEBUG on (``-v 2``), every failure's is logged.
        """
        if not claim.traceback:
            return ""
        key = (claim.intent.kind, (claim.cause or "").partition(":")[0])
        if key in self._shown and not log.isEnabledFor(logging.DEBUG):
            return " (traceback logged above)"
        self._shown.add(key)
        return "\n" + claim.traceback.rstrip("\n")

    def _then(self, ending: Ending, now: datetime) -> str:
        at = _retry_at(ending)
        if at is None:
            return f"cancelled, MAX_ATTEMPTS ({self._max_attempts}) reached"
        return f"retry in {(at - now).total_seconds():.0f} s"


def _retry_at(ending: Ending) -> datetime | None:
    """When a failed attempt's intent runs again; ``None``: it was cancelled."""
    return None if ending.state == State.CANCELLED else ending.next_at


def _target_event(claim: Claim) -> TargetEvent:
    """What a recorded result says of its target: what counts as a breaker's failure.

    A handler error and a timeout are failures; a success closes; a hold
    holds; a snooze, a ``Stop`` and a release at shutdown say nothing of the
    partner (they matter only to a half-open probe, which another intent
    then makes).
    """
    intent, outcome = claim.intent, claim.outcome
    if outcome is Outcome.SUCCESS:
        event = Event.SUCCESS
    elif outcome in (Outcome.ERROR, Outcome.TIMEOUT):
        event = Event.FAILURE
    elif outcome is Outcome.SNOOZED and claim.hold:
        event = Event.HOLD
    else:
        event = Event.NEUTRAL
    error = (claim.cause or "") if event == Event.FAILURE else ""
    return TargetEvent(intent.kind, intent.target, event, intent.id, claim.due, error)


def _retried(ending: Ending) -> bool:
    return ending.state != State.CANCELLED and ending.next_at is not None


def _distinct(claims: list[Claim]) -> tuple[list[Claim], list[Claim]]:
    """One batch of distinct intents, and the rest: a second claim of one intent waits a batch.

    Both statements answer by id, so one intent can appear once per batch
    (this pool may hold an old claim of an intent it claimed again).
    """
    batch: list[Claim] = []
    later: list[Claim] = []
    ids: set[str] = set()
    for claim in claims:
        (later if claim.intent.id in ids else batch).append(claim)
        ids.add(claim.intent.id)
    return batch, later
