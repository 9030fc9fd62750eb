"""Reads on the QuerySet, transitions on the manager: one method per verb of the queue.

The manager checks its arguments (a refused call writes nothing), asks the
backend of its connection (``store/``) to run the one guarded statement
of the transition, and announces what moved. Success is read from what the
statement touched, so two callers racing for the same intent cannot both
win. Fenced methods match ``claim_token`` as well as the state: a worker
whose lease was taken over holds a token that no longer matches anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models, router, transaction
from django.db.models import Q

from django_intents.conf import get_settings
from django_intents.handlers import check_kind
from django_intents.rules import states, validation
from django_intents.rules.batches import INSERT_BATCH, MAX_LIMIT
from django_intents.rules.identity import check_id, check_text
from django_intents.rules.limits import applying, ordered_kinds, rates_of
from django_intents.rules.retries import retry_at
from django_intents.rules.targets import (
    Breaker,
    Event,
    TargetHealth,
    TargetRow,
    hold_for,
    target_key,
)
from django_intents.rules.validation import aware, item_row, later, new_row, stamp
from django_intents.signals import intents_rescued, intents_transitioned, target_state_changed
from django_intents.store import Backend, ClaimFilters, backend_for
from django_intents.store import targets as target_health
from django_intents.store.admin import administer_many, redrive_batch
from django_intents.store.base import Ending
from django_intents.store.claims import Claims
from django_intents.store.clock import now_or
from django_intents.store.memory import ClaimMemory
from django_intents.store.targetrows import close_target_row, hold_target_row, read_target_rows
from django_intents.store.targets import Change, TargetEvent
from django_intents.tracing import sending

if TYPE_CHECKING:
    from django_intents.models import Intent


class IntentQuerySet(models.QuerySet["Intent"]):
    """The reads: intents by state, and what a claim could take, in claim order."""

    def active(self) -> IntentQuerySet:
        return self.filter(state__in=states.ACTIVE)

    def terminal(self) -> IntentQuerySet:
        return self.filter(state__in=states.TERMINAL)

    def pending(self, kind: str | None = None) -> IntentQuerySet:
        """Intents not yet finished (``pending`` or ``running``), in claim order."""
        qs = self.active()
        if kind is not None:
            qs = qs.filter(kind=check_text("kind", kind))
        return qs.order_by(*states.CLAIM_ORDER)

    def in_state(self, state: str | None = None) -> IntentQuerySet:
        if state is None:
            return self.order_by(*states.CLAIM_ORDER)
        if state not in states.ALL:
            expected = ", ".join(states.ALL)
            raise ValueError(f"unknown state {state!r}; expected one of {expected}")
        return self.filter(state=state).order_by(*states.CLAIM_ORDER)

    def due(self, now: datetime | None = None) -> IntentQuerySet:
        """Intents a claim at ``now`` could take: due pending ones and expired leases."""
        return self.filter(states.due(now_or(now, self.db))).order_by(*states.CLAIM_ORDER)

    def expired(self, now: datetime | None = None) -> IntentQuerySet:
        """Running intents whose lease ran out by ``now``: due again, their holders fenced."""
        return self.filter(states.expired(now_or(now, self.db)))

    def page_by_age(
        self, after: tuple[datetime, str] | None, size: int
    ) -> list[tuple[datetime, str]]:
        """The ``(updated_at, id)`` of the next ``size`` of these intents after ``after``,
        oldest first: a keyset page, so a pass over finished intents reads each once
        however many pages it takes, through the ``(state, updated_at)`` index."""
        page = self.order_by("updated_at", "id")
        if after is not None:
            at, last = after
            # The redundant ">=" is the index bound; the OR alone would make the
            # database rescan the rows already done, once per page.
            page = page.filter(Q(updated_at__gte=at), Q(updated_at__gt=at) | Q(id__gt=last))
        return list(page.values_list("updated_at", "id")[:size])


class IntentManager(models.Manager.from_queryset(IntentQuerySet)):  # type: ignore[misc]
    """``Intent.objects``: the transitions, one method each, and the reads of ``IntentQuerySet``.

    Fenced transitions (``renew``, ``complete``, ``retry``, ...) are a
    claimant's; administrative ones (``retry_now``, ``cancel`` and their
    ``_many`` forms) an operator's, whatever the claim; ``pause`` and
    ``resume`` act on a kind.
    """

    # -- enqueue -------------------------------------------------------------

    def enqueue(
        self,
        kind: str,
        event_id: str,
        target: str,
        payload: Any = None,
        *,
        next_at: datetime | None = None,
        id: str | None = None,
        now: datetime | None = None,
        priority: int | None = None,
    ) -> str:
        """Record an intent in the caller's transaction; a known id is left as it is.

        A kind that no handler runs (and that ``INTENTS["EXTERNAL_KINDS"]`` does
        not list) is refused with a ``ValueError``, like any other invalid argument.
        """
        given = None if now is None else aware("now", now)
        row = new_row(kind, event_id, target, payload, next_at, id, None, priority=priority)
        check_kind(row["kind"])
        backend = self._backend(self._route(row))
        stamp(row, now_or(given, backend.alias))
        with sending([row]):
            self._announce(states.State.PENDING, backend.insert([row]), backend)
        return str(row["id"])

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, now: datetime | None = None
    ) -> list[str]:
        """Record many intents; every item is checked before anything is written.

        Routed to several databases (``INTENTS["DATABASES"]``), each database's
        share is written in its own transaction, in the order the items came;
        the result keeps the items' order whatever database each went to.
        """
        given = None if now is None else aware("now", now)
        if isinstance(items, Mapping | str | bytes):
            raise TypeError("items must be an iterable of dicts, not a single value")
        rows = [item_row(index, item, None) for index, item in enumerate(items)]
        for kind in {row["kind"] for row in rows}:
            check_kind(kind)
        unique = list({row["id"]: row for row in reversed(rows)}.values())[::-1]
        shares: dict[str, list[dict[str, Any]]] = {}
        for row in unique:
            shares.setdefault(self._route(row), []).append(row)
        for alias, share in shares.items():
            backend = self._backend(alias)
            at = now_or(given, alias)
            for row in share:
                stamp(row, at)
            with sending(share), _atomic_if(len(share) > INSERT_BATCH, alias):
                for start in range(0, len(share), INSERT_BATCH):
                    kinds = backend.insert(share[start : start + INSERT_BATCH])
                    self._announce(states.State.PENDING, kinds, backend)
        return [str(row["id"]) for row in rows]

    # Django's ``a`` prefix (``QuerySet.aget``): the database is reached from a
    # thread-sensitive executor, so an async view can enqueue without
    # SynchronousOnlyOperation, and the validation errors arrive unchanged.

    async def aenqueue(self, *args: Any, **kwargs: Any) -> str:
        """Await :meth:`enqueue` from async code: same arguments, errors and idempotence.

        Like Django's own ``a`` methods, it takes :meth:`enqueue`'s arguments as
        they are, so the two can never drift apart.
        """
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    async def aenqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, now: datetime | None = None
    ) -> list[str]:
        """Await :meth:`enqueue_many` from async code: one invalid item still writes nothing."""
        return await sync_to_async(self.enqueue_many)(items, now=now)

    # -- claim ---------------------------------------------------------------

    def claim(
        self,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Intent | None:
        """Claim the oldest due intent, or return ``None`` when nothing is due."""
        claimed = self.claim_many(1, now=now, lease=lease, kinds=kinds)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        limit: int,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
        kinds: Iterable[str] | None = None,
        since: datetime | None = None,
        complete: Iterable[tuple[str, str]] = (),
        memory: ClaimMemory | None = None,
        paced: int | None = None,
    ) -> Claims[Intent]:
        """Claim up to ``limit`` due intents in claim order, in one transaction.

        ``since`` leaves out intents whose ``next_at`` is earlier: a pool's
        claims start where the live rows start, not at the finished rows'
        index entries that VACUUM has yet to remove (docs/workers.md).
        With ``MAX_ATTEMPTS``, cancelling expired leases that used their last
        attempt is left to a claim without ``since``: one statement fewer on
        most of a pool's claims, and such a lease is never claimed meanwhile.
        The list's ``held_back`` says whether ``LIMITS`` may have held back a
        due intent the claim passed, which keeps a pool's floor where it is.
        ``complete``: up to ``INSERT_BATCH`` ``(id, claim_token)`` pairs to
        complete first, as ``complete_many`` does (the ids completed are the
        list's ``completed``): a pool's finished claims, so that their places
        under ``LIMITS`` are free for this claim, in its round trip on PostgreSQL.
        ``memory``: for a pool, what its claims remember between turns
        (``store.memory.ClaimMemory``); without it a claim has learned nothing.
        ``paced``: at most this many intents of kinds with a ``rate`` or
        ``ordered`` (a pool that queues other kinds' claims ahead takes theirs
        only for what starts at once: ``Demand.paced``).
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        if paced is not None and (
            isinstance(paced, bool) or not isinstance(paced, int) or paced < 0
        ):
            raise ValueError(f"paced must be a non-negative integer or None, not {paced!r}")
        pairs = validation.claims(complete, "complete", most=INSERT_BATCH)
        now = now_or(now, self._alias())
        until = later(now, validation.lease(lease, get_settings().lease), "lease")
        settings = get_settings()
        filters = _filters(kinds, since, settings.max_attempts)
        if filters.kinds == []:
            return Claims(completed=self.complete_many(pairs, now=now))
        # Every claim applies the limits (SPEC §10), the rates and the order (§14):
        # a pool's, and this one's for a caller.
        filters = replace(
            filters,
            limits=applying(settings.limits, filters.kinds),
            rates=applying(rates_of(settings.targets), filters.kinds),
            ordered=tuple(ordered_kinds(settings.targets, filters.kinds)),
            paced=paced,
        )
        backend = self._backend()
        if filters.max_attempts is not None and since is None:
            # A claim above a floor leaves this to the pool's next full claim:
            # the attempts filter keeps it from claiming an exhausted lease meanwhile.
            error = (
                f"lease expired on the last allowed attempt (MAX_ATTEMPTS={filters.max_attempts})"
            )
            cancelled = backend.cancel_exhausted(
                now=now, max_attempts=filters.max_attempts, kinds=filters.kinds, error=error
            )
            self._announce(states.State.CANCELLED, cancelled, backend)
        breakers = _breakers(settings.targets, filters.kinds)
        filters = self._watched(backend, filters, now, memory)
        filters = self._paced(backend, filters, now, memory)
        claimed = backend.claim(
            now=now,
            until=until,
            limit=min(limit, MAX_LIMIT),
            filters=filters,
            complete=pairs,
            memory=memory,
        )
        if filters.exempt:
            claimed = self._probes(backend, claimed, filters.exempt, now, memory)
        self._announce(states.State.COMPLETED, [kind for _, kind in claimed.completed], backend)
        self._announce(states.State.RUNNING, [intent.kind for intent, _ in claimed], backend)
        rescued = [
            (intent.kind, (now - lease_end).total_seconds())
            for intent, lease_end in claimed
            if lease_end is not None
        ]
        if rescued and intents_rescued.has_listeners(self.model):
            _after_commit(
                backend,
                lambda: intents_rescued.send(
                    sender=self.model, rescued=rescued, database=backend.alias
                ),
            )
        # A probe taken over was counted when its lease expired (targets.watch).
        probes = set(filters.exempt)
        taken_over = [
            TargetEvent(intent.kind, intent.target, Event.FAILURE, intent.id, error=_EXPIRED)
            for intent, lease_end in claimed
            if lease_end is not None
            and intent.kind in breakers
            and target_key(intent.kind, intent.target) not in probes
        ]
        if taken_over:
            self.record_target_events(taken_over, now=now)
        done = {id for id, _ in claimed.completed}
        completed = [id for id, _ in pairs if id in done]
        return claimed.carrying([intent for intent, _ in claimed], completed=completed)

    def has_due(
        self,
        *,
        now: datetime | None = None,
        kinds: Iterable[str] | None = None,
        since: datetime | None = None,
        memory: ClaimMemory | None = None,
    ) -> bool:
        """Whether a claim at ``now`` would find an intent: one index lookup, no lock, no write.

        Lets a poller on SQLite, where every claim takes the database's one
        write lock, look before it claims. ``since`` is as for ``claim_many``.
        With a pool's ``memory``, it also looks at the targets of the kinds'
        breakers when their turn comes (``store/targets.watch``), as a claim
        does: a half-open target awaiting its probe has an intent to claim.
        """
        now = now_or(now, self._alias())
        filters = _filters(kinds, since, None)
        if filters.kinds == []:
            return False
        backend = self._backend()
        if memory is not None:
            filters = self._watched(backend, filters, now, memory)
        return backend.has_due(now=now, filters=filters)

    def _watched(
        self, backend: Backend, filters: ClaimFilters, now: datetime, memory: ClaimMemory | None
    ) -> ClaimFilters:
        """``filters`` exempting the half-open targets this claimer may probe; with their
        turn due, a look at the targets of the kinds' breakers first (``targets.watch``)."""
        breakers = _breakers(get_settings().targets, filters.kinds)
        if not breakers:
            return filters
        if memory is None or memory.watch_due():
            probing, changes = target_health.watch(
                backend, kinds=sorted(breakers), now=now, breakers=breakers
            )
            self._changed(changes, backend)
            if memory is not None:
                memory.probing = probing
        else:
            probing = memory.probing
        return replace(filters, exempt=tuple(sorted(probing)))

    def _paced(
        self, backend: Backend, filters: ClaimFilters, now: datetime, memory: ClaimMemory | None
    ) -> ClaimFilters:
        """``filters`` with the paces holds taught targets of the claimed kinds that have
        no rate of their own (``store/targets.paces``); a pool reads them twice a second
        for every kind its claims take, and at once after one of its results held a
        target; a claim without a memory reads those of its kinds."""
        if memory is None:
            paces = target_health.paces(backend, now=now, kinds=filters.kinds)
        elif memory.paces_due():
            paces = memory.paces = target_health.paces(backend, now=now, kinds=None)
        else:
            paces = memory.paces
        asked = None if filters.kinds is None else set(filters.kinds)
        kept = {
            pair: pace
            for pair, pace in paces.items()
            if pair[0] not in filters.rates and (asked is None or pair[0] in asked)
        }
        return replace(filters, paces=kept) if kept else filters

    # -- fenced transitions ----------------------------------------------------

    def renew(
        self,
        id: str,
        claim_token: str,
        *,
        now: datetime | None = None,
        lease: float | timedelta | None = None,
    ) -> bool:
        """Extend the lease of a claim this caller still holds."""
        now = now_or(now, self._alias())
        until = later(now, validation.lease(lease, get_settings().lease), "lease")
        id, claim_token = check_id(id), validation.token(claim_token)
        return self._backend().renew(id, claim_token, now=now, until=until)

    def complete(self, id: str, claim_token: str, *, now: datetime | None = None) -> bool:
        now = now_or(now, self._alias())
        id, claim_token = check_id(id), validation.token(claim_token)
        backend = self._backend()
        return self._moved(
            states.State.COMPLETED, backend.complete(id, claim_token, now=now), backend
        )

    def complete_many(
        self, pairs: Iterable[tuple[str, str]], *, now: datetime | None = None
    ) -> list[str]:
        """Complete every ``(id, claim_token)`` claim still held; return the ids completed.

        One statement per ``INSERT_BATCH`` pairs, each fenced as ``complete``
        is: a pair whose claim was lost is left alone, missing from the result.
        """
        checked = validation.claims(pairs, "pairs")
        if not checked:  # nothing to write: no query, not even the clock's
            if now is not None:
                aware("now", now)
            return []
        now = now_or(now, self._alias())
        backend = self._backend()
        done: list[tuple[str, str]] = []
        with _atomic_if(len(checked) > INSERT_BATCH, backend.alias):
            for start in range(0, len(checked), INSERT_BATCH):
                done += backend.complete_many(checked[start : start + INSERT_BATCH], now=now)
        self._announce(states.State.COMPLETED, [kind for _, kind in done], backend)
        completed = {id for id, _ in done}
        return list(dict.fromkeys(id for id, _ in checked if id in completed))

    def finish_many(self, endings: Iterable[Ending], *, now: datetime | None = None) -> list[str]:
        """Apply many fenced retries, cancellations and releases at once; return the ids moved.

        The batch form of ``retry``, ``cancel_claim`` and ``release`` for a pool
        that records every result on its own connection: each ``Ending`` says
        the state, due time and error its claim ends with, already decided
        (the pool knows the attempt number of every claim it holds). An ending
        whose claim was lost is left alone and missing from the result.
        """
        checked: dict[str, Ending] = {}
        for e in endings:
            if e.state not in (states.State.PENDING, states.State.CANCELLED):
                raise ValueError(f"an ending goes to pending or cancelled, not {e.state!r}")
            if e.unstarted and (e.state != states.State.PENDING or e.snooze):
                raise ValueError(f"an unstarted claim of {e.id} is only released to pending")
            ending = Ending(
                id=check_id(e.id),
                token=validation.token(e.token),
                state=str(e.state),
                next_at=None if e.next_at is None else aware("next_at", e.next_at),
                error=None if e.error is None else validation.error_text(e.error),
                snooze=bool(e.snooze),
                unstarted=bool(e.unstarted),
                traceback=None if e.traceback is None else validation.traceback_text(e.traceback),
            )
            if checked.setdefault(ending.id, ending) is not ending:
                raise ValueError(f"intent {ending.id} ends twice in one batch")
        if not checked:  # nothing to write: no query, not even the clock's
            if now is not None:
                aware("now", now)
            return []
        now = now_or(now, self._alias())
        backend, rows = self._backend(), list(checked.values())
        moved: list[tuple[str, str, str]] = []
        with _atomic_if(len(rows) > INSERT_BATCH, backend.alias):
            for start in range(0, len(rows), INSERT_BATCH):
                moved += backend.finish_many(rows[start : start + INSERT_BATCH], now=now)
        for state in (states.State.PENDING, states.State.CANCELLED):
            self._announce(state, [kind for _, kind, to in moved if to == state], backend)
        return [id for id, _, _ in moved]

    def retry(
        self, id: str, claim_token: str, cause: object = None, *, now: datetime | None = None
    ) -> bool:
        """Give the intent back for a later attempt, or cancel it once attempts run out."""
        now = now_or(now, self._alias())
        id, claim_token = check_id(id), validation.token(claim_token)
        error = validation.error_text(cause)
        backend = self._backend()
        attempts = backend.attempts(id, claim_token)
        if attempts is None:
            return False
        # attempts only changes when a claim replaces the token, so the fence
        # of the update below also guarantees this count is still the current one.
        next_at = retry_at(id, attempts, get_settings().max_attempts, now)
        if next_at is None:
            kinds = backend.cancel_claim(id, claim_token, now=now, error=error)
            return self._moved(states.State.CANCELLED, kinds, backend)
        kinds = backend.retry(id, claim_token, now=now, next_at=next_at, error=error)
        return self._moved(states.State.PENDING, kinds, backend)

    def cancel_claim(
        self, id: str, claim_token: str, cause: object = None, *, now: datetime | None = None
    ) -> bool:
        """End the intent for good: the handler said it can never succeed."""
        now, error = now_or(now, self._alias()), validation.error_text(cause)
        id, claim_token = check_id(id), validation.token(claim_token)
        backend = self._backend()
        kinds = backend.cancel_claim(id, claim_token, now=now, error=error)
        return self._moved(states.State.CANCELLED, kinds, backend)

    def release(self, id: str, claim_token: str, *, now: datetime | None = None) -> bool:
        """Hand an unfinished claim back: ``pending`` and due now, ``attempts`` kept.

        A worker shutting down releases the intents its handlers did not finish,
        so they run again at once instead of waiting for the lease to expire.
        """
        now = now_or(now, self._alias())
        id, claim_token = check_id(id), validation.token(claim_token)
        backend = self._backend()
        return self._moved(states.State.PENDING, backend.release(id, claim_token, now=now), backend)

    def complete_pending(self, id: str, *, now: datetime | None = None) -> bool:
        """Mark a pending intent done because the caller did the work inline."""
        now, id = now_or(now, self._alias()), check_id(id)
        backend = self._backend()
        return self._moved(states.State.COMPLETED, backend.complete_pending(id, now=now), backend)

    # -- administrative: what an operator does, whatever the claim ---------------

    def retry_now(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Make an unfinished intent due now; a current claimant loses its claim.

        A finished intent is left alone. The claimant is fenced: its token
        matches nothing any more, so whatever it records later is dropped.
        """
        now, id = now_or(now, self._alias()), check_id(id)
        backend = self._backend()
        return self._moved(states.State.PENDING, backend.retry_now(id, now=now), backend)

    def cancel(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Cancel an unfinished intent; a current claimant loses its claim."""
        now, id = now_or(now, self._alias()), check_id(id)
        backend = self._backend()
        return self._moved(states.State.CANCELLED, backend.cancel(id, now=now), backend)

    def retry_now_many(self, ids: Iterable[str], *, now: datetime | None = None) -> list[str]:
        """``retry_now`` on each of ``ids``; return the ids it moved, in no particular order.

        What the admin's actions run on a selection: one statement per batch
        of intents (``store/admin.py``), not one per intent.
        """
        return self._many("retry_now", states.State.PENDING, ids, now)

    def cancel_many(self, ids: Iterable[str], *, now: datetime | None = None) -> list[str]:
        """``cancel`` on each of ``ids``; return the ids it moved, in no particular order."""
        return self._many("cancel", states.State.CANCELLED, ids, now)

    def _many(self, name: str, to: str, ids: Iterable[str], now: datetime | None) -> list[str]:
        checked = _checked_ids(ids)
        if not checked:
            return []
        now, backend = now_or(now, self._alias()), self._backend()
        moved = administer_many(backend, name, checked, now=now)
        self._moved(to, [kind for _, kind in moved], backend)
        return [id for id, _ in moved]

    # -- redrive (SPEC §14) --------------------------------------------------------

    def redrive(
        self,
        *,
        kind: str | None = None,
        target: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
        batch_size: int = INSERT_BATCH,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Run the matching cancelled intents again; return how many (``dry_run``: would).

        Each becomes ``pending``, due at ``now``, with its id, payload,
        ``attempts`` and ``last_error`` kept and a fresh ``MAX_ATTEMPTS``: the
        attempts that counted so far are written off (``written_off``). An
        intent matches by ``kind``, ``target`` and when it was cancelled (its
        ``updated_at``): from ``finished_after`` (inclusive) to
        ``finished_before`` (exclusive), and not after ``now``, so that one
        cancelled again while the redrive runs is left for the next.

        Batches of ``batch_size`` commit one at a time, each fenced on the
        state: a redrive of a million intents holds no lock for long, and an
        intent that moved meanwhile is left as it is and not counted. Call it
        outside a transaction, or every batch's locks are held until the
        caller commits. ``progress`` is called after each batch with the
        number of intents it looked at. ``dry_run`` counts what would be run
        again, in one query, and writes nothing.
        """
        if not isinstance(dry_run, bool):
            raise TypeError(f"dry_run must be True or False, not {dry_run!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size must be an int, not {type(batch_size).__name__}")
        if not 1 <= batch_size <= INSERT_BATCH:
            raise ValueError(f"batch_size must be from 1 to {INSERT_BATCH}, not {batch_size}")
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be callable, not {type(progress).__name__}")
        now = now_or(now, self._alias())
        rows = self.redrivable(
            kind=kind,
            target=target,
            finished_after=finished_after,
            finished_before=finished_before,
            now=now,
        )
        if dry_run:
            return rows.count()
        backend, done, last = self._backend(), 0, None
        while page := rows.page_by_age(last, batch_size):
            ids = [id for _, id in page]
            done += len(self._redrive(backend, ids, now))
            if progress is not None:
                progress(len(ids))
            if len(page) < batch_size:
                break
            last = page[-1]
        return done

    def redrivable(
        self,
        *,
        kind: str | None = None,
        target: str | None = None,
        finished_after: datetime | None = None,
        finished_before: datetime | None = None,
        now: datetime | None = None,
    ) -> IntentQuerySet:
        """The cancelled intents that ``redrive`` with the same arguments would run again."""
        kind = None if kind is None else check_text("kind", kind)
        target = None if target is None else check_text("target", target)
        after = None if finished_after is None else aware("finished_after", finished_after)
        before = None if finished_before is None else aware("finished_before", finished_before)
        if after is not None and before is not None and after >= before:
            raise ValueError(
                f"finished_after ({after}) must be earlier than finished_before ({before})"
            )
        lookups = {
            "state": states.State.CANCELLED,
            "updated_at__lte": now_or(now, self._alias()),
            "kind": kind,
            "target": target,
            "updated_at__gte": after,
            "updated_at__lt": before,
        }
        rows: IntentQuerySet = self.get_queryset().filter(
            **{lookup: value for lookup, value in lookups.items() if value is not None}
        )
        return rows

    def redrive_many(self, ids: Iterable[str], *, now: datetime | None = None) -> list[str]:
        """Redrive the cancelled intents among ``ids``; return the ids it moved, in no
        particular order. The others (pending, running, completed, unknown) are left.

        What the admin's *Redrive* runs on a selection, a transaction per
        ``INSERT_BATCH`` intents as ``redrive`` does.
        """
        checked = _checked_ids(ids)
        if not checked:
            return []
        now, backend = now_or(now, self._alias()), self._backend()
        moved: list[str] = []
        for start in range(0, len(checked), INSERT_BATCH):
            moved += self._redrive(backend, checked[start : start + INSERT_BATCH], now)
        return moved

    def _redrive(self, backend: Backend, ids: list[str], now: datetime) -> list[str]:
        moved = redrive_batch(backend, ids, now=now)
        self._announce(states.State.PENDING, [kind for _, kind in moved], backend)
        return [id for id, _ in moved]

    # -- paused kinds (SPEC §11) -------------------------------------------------

    def pause(self, kind: str, *, now: datetime | None = None) -> bool:
        """Stop every claim of ``kind`` from the next one on; ``True`` if it was not paused.

        A pause is a row in ``PausedKind``. Every claim and due probe leaves
        paused kinds out in its own statement, so a pool learns of a pause at
        its next claim with no query of its own; the attempts already running
        finish normally, and enqueue keeps recording.
        """
        kind, now = check_text("kind", kind), now_or(now, self._alias())
        return self._backend().pause(kind, now=now)

    def resume(self, kind: str) -> bool:
        """Let claims take ``kind`` again; ``True`` if it was paused."""
        return self._backend().resume(check_text("kind", kind))

    def paused(self) -> set[str]:
        """The kinds paused now."""
        return self._backend().paused()

    # -- targets (SPEC §14) --------------------------------------------------------

    def targets(
        self, kind: str | None = None, state: str | None = None, *, now: datetime | None = None
    ) -> list[TargetRow]:
        """Every (kind, target) that is not plainly healthy, by kind and target.

        Held, open and half-open targets, and closed ones counting failures;
        ``state`` narrows to one of ``rules.targets.TargetHealth``. A row's
        ``until`` is ``None`` once ``now`` has passed it.
        """
        if kind is not None:
            kind = check_text("kind", kind)
        if state is not None and state not in set(TargetHealth):
            expected = ", ".join(TargetHealth)
            raise ValueError(f"unknown target state {state!r}; expected one of {expected}")
        alias = self._alias()
        return read_target_rows(alias, now=now_or(now, alias), kind=kind, state=state)

    def open_target(
        self, kind: str, target: str, seconds: float, *, now: datetime | None = None
    ) -> bool:
        """Hold every intent of ``kind`` to ``target`` for ``seconds`` from now; ``True``
        unless it was already held until then.

        Nothing of that target is claimed until then (attempts already running
        finish); ``close_target`` lifts it sooner. A hold by hand keeps the
        target's count of failures.
        """
        kind, target = check_text("kind", kind), check_text("target", target)
        delta = hold_for(seconds)
        alias = self._alias()
        now = now_or(now, alias)
        until = later(now, delta, "seconds")
        previous = hold_target_row(alias, kind, target, until=until, now=now)
        return self._target_moved(kind, target, TargetHealth.HELD, previous)

    def close_target(self, kind: str, target: str) -> bool:
        """Make ``target`` healthy now: claims take its intents again at once, its
        failures and cooldown forgotten; ``True`` if it was not plainly healthy."""
        kind, target = check_text("kind", kind), check_text("target", target)
        previous = close_target_row(self._alias(), kind, target)
        return self._target_moved(kind, target, TargetHealth.CLOSED, previous)

    def _target_moved(
        self, kind: str, target: str, state: TargetHealth, previous: TargetHealth | None
    ) -> bool:
        """Send ``target_state_changed`` once the change commits; whether there was one."""
        if previous is None:
            return False
        self._changed([(kind, target, state, previous)], self._backend())
        return True

    # -- target health (SPEC §14) -------------------------------------------------

    def record_target_events(
        self, events: Iterable[TargetEvent], *, now: datetime | None = None
    ) -> list[Change]:
        """Apply what attempts' ends say of their targets (``store/targets.py``): count a
        breaker's failures, open, close, hold. In the caller's transaction when there is
        one, so that a pool writes them with the results they come from; the
        changes are announced (``target_state_changed``) once it commits, and
        returned as ``(kind, target, state, previous)``."""
        events = list(events)
        if not events:
            return []
        now, backend = now_or(now, self._alias()), self._backend()
        breakers = _breakers(get_settings().targets, None)
        changes = target_health.record(backend, events, now=now, breakers=breakers)
        self._changed(changes, backend)
        return changes

    def end_holds(self, *, now: datetime | None = None) -> int:
        """Delete the rows of holds that are over (a pool's housekeeping); how many changed."""
        now, backend = now_or(now, self._alias()), self._backend()
        changes = target_health.ended(backend, now=now, rated=rates_of(get_settings().targets))
        self._changed(changes, backend)
        return len(changes)

    def _probes(
        self,
        backend: Backend,
        claimed: Claims[Any],
        exempt: tuple[str, ...],
        now: datetime,
        memory: ClaimMemory | None,
    ) -> Claims[Any]:
        """Keep one intent per half-open target as its probe, if this claim wins it; give
        back unstarted what else the claim took of the targets it probed."""
        keys = set(exempt)
        kept: list[Any] = []
        back: list[Ending] = []
        decided: dict[str, bool] = {}
        for pair in claimed:
            intent = pair[0]
            key = target_key(intent.kind, intent.target)
            if key not in keys:
                kept.append(pair)
                continue
            if key not in decided:
                decided[key] = target_health.take_probe(backend, key, intent.id, now=now)
                if memory is not None:
                    memory.probing.pop(key, None)
                if decided[key]:
                    kept.append(pair)
                    continue
            back.append(Ending(intent.id, intent.claim_token, states.State.PENDING, unstarted=True))
        if not back:
            return claimed
        backend.finish_many(back, now=now)
        result = claimed.carrying(kept, completed=claimed.completed)
        result.held_back = True
        return result

    def _changed(self, changes: list[Change], backend: Backend) -> None:
        """Announce target state changes once they are committed."""
        if not changes or not target_state_changed.has_listeners(self.model):
            return
        model = self.model

        def send() -> None:
            for kind, target, state, previous in changes:
                target_state_changed.send(
                    sender=model,
                    kind=kind,
                    target=target,
                    state=state,
                    previous=previous,
                    database=backend.alias,
                )

        _after_commit(backend, send)

    # -- plumbing --------------------------------------------------------------

    def _alias(self) -> str:
        return self._db or router.db_for_write(self.model)

    def _backend(self, alias: str | None = None) -> Backend:
        return backend_for(connections[alias or self._alias()], self.model)

    def _route(self, row: Mapping[str, Any]) -> str:
        """The database a new intent goes to: ``db_manager()``'s, else the routers' answer
        for its kind, target and id, which must be one of ``INTENTS["DATABASES"]``."""
        if self._db:
            return str(self._db)
        alias = router.db_for_write(
            self.model, kind=row["kind"], target=row["target"], id=row["id"]
        )
        aliases = get_settings().databases
        if aliases is not None and alias not in aliases:
            raise ImproperlyConfigured(
                f"the database routers sent intent {row['id']!r} (target {row['target']!r}) "
                f"to {alias!r}, which INTENTS['DATABASES'] does not list ({', '.join(aliases)})"
            )
        return str(alias)

    def _moved(self, to: str, kinds: list[str], backend: Backend) -> bool:
        self._announce(to, kinds, backend)
        return bool(kinds)

    def _announce(self, to: str, kinds: list[str], backend: Backend) -> None:
        """Tell receivers (metrics) about transitions once they are committed."""
        if kinds and intents_transitioned.has_listeners(self.model):
            model = self.model
            send = lambda: intents_transitioned.send(  # noqa: E731
                sender=model, to=to, kinds=kinds, database=backend.alias
            )
            _after_commit(backend, send)


def _after_commit(backend: Backend, send: Callable[[], object]) -> None:
    """Send now outside a transaction; inside one, once it commits, never if it rolls back."""
    if backend.connection.in_atomic_block:
        transaction.on_commit(send, using=backend.alias)
    else:
        send()


def _checked_ids(ids: Iterable[str]) -> list[str]:
    """``ids`` checked, each once, in order; a single string is refused, not spelled out."""
    if isinstance(ids, str | bytes):
        raise TypeError("ids must be an iterable of ids, not a single string")
    return list(dict.fromkeys(check_id(id) for id in ids))


def _filters(kinds: Any, since: Any, max_attempts: int | None) -> ClaimFilters:
    return ClaimFilters(
        kinds=validation.kinds(kinds),
        since=None if since is None else aware("since", since),
        max_attempts=max_attempts,
    )


_EXPIRED = "the lease expired and was taken over"


def _breakers(policies: Mapping[str, Any], kinds: list[str] | None) -> dict[str, Breaker]:
    """The breakers of ``kinds`` (``None``: every kind)."""
    return {
        kind: policy.breaker
        for kind, policy in policies.items()
        if policy.breaker is not None and (kinds is None or kind in kinds)
    }


def _atomic_if(needed: bool, alias: str) -> Any:
    """A transaction where several statements must be one; none for a single one."""
    return transaction.atomic(using=alias) if needed else contextlib.nullcontext()
