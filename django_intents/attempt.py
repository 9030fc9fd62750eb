"""One run of a handler on one claimed intent: what the handler can ask of it, and
what the pool tells it.

The pool sets ``cancelled`` when the claim is lost (an administrator retried
or cancelled the intent, another worker took over an expired lease) or when
the pool shuts down; a long handler should look at it between steps. The
claim token is the only truth, though: ``atomic()`` checks it inside the
handler's own transaction, so a handler's writes can never outlive its claim.

Handlers use ``cancelled``, ``lost``, ``check()``, ``wait_cancelled()`` and
``atomic()``. The pool uses ``mark_cancelled()``, ``mark_lost()`` and
``when_lost()``: they are public so that the pool's side of an attempt is a
named interface, not for handlers to call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from django.db import router, transaction

from django_intents.exceptions import ClaimLost

if TYPE_CHECKING:
    from django_intents.rules.intent import IntentRow

_MAKING = threading.Lock()  # makes each attempt's ``cancelled`` once, whichever thread asks
# Guards every attempt's lost and cancel state: held for a few assignments,
# never while calling out, so one lock serves them all without a Lock per intent.
_GUARD = threading.Lock()


class Attempt:
    """Passed to every handler with its intent: ``handler(intent, attempt)``.

    To unit-test a handler, claim an intent and pass ``Attempt(intent)``.
    """

    def __init__(self, intent: IntentRow, *, using: str | None = None) -> None:
        self.intent = intent
        self._cancelled: threading.Event | None = None
        self._using = using
        self._lost = False
        self._completed = False
        self._on_cancel: list[Callable[[], None]] = []
        self._on_lost: Callable[[], None] | None = None

    @property
    def cancelled(self) -> threading.Event:
        """Set when the claim is lost or the pool is stopping; a ``threading.Event``.

        Made on first use: an event costs more to build than a no-op handler
        costs to run, and most handlers never look at it.
        """
        event = self._cancelled
        if event is None:
            with _MAKING:
                event = self._cancelled
                if event is None:
                    event = self._cancelled = threading.Event()
        return event

    def __repr__(self) -> str:
        return f"<Attempt {self.intent.kind} {self.intent.id[:12]} #{self.intent.attempts}>"

    @property
    def lost(self) -> bool:
        """True once the claim is known to be gone; ``cancelled`` alone may mean shutdown."""
        return self._lost

    @property
    def completed(self) -> bool:
        """True once ``atomic()`` committed the completion: the worker records nothing more."""
        return self._completed

    def check(self) -> None:
        """Raise ``ClaimLost`` if the attempt was cancelled; call it between steps."""
        if self.cancelled.is_set():
            reason = "its claim was lost" if self._lost else "the worker is shutting down"
            raise ClaimLost(f"attempt on intent {self.intent.id} was cancelled: {reason}")

    async def wait_cancelled(self) -> None:
        """Return once the attempt is cancelled: the claim was lost or the pool is stopping.

        For async handlers that wait on something else meanwhile, e.g. with
        ``asyncio.wait`` beside the request they make. A lost claim also
        cancels the handler's task (``eventloop.py``); a stop only wakes this.
        """
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def resolve() -> None:
            if not woken.done():
                woken.set_result(None)

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(resolve)

        with _GUARD:
            if self.cancelled.is_set():
                return
            self._on_cancel.append(wake)
        await woken

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Commit the block's writes and the intent's completion together, or neither.

        The completion is fenced by the claim token inside the block's
        transaction: if the claim was fenced first, ``ClaimLost`` is raised and
        the writes roll back. ``cancelled`` is deliberately not consulted: during
        a shutdown the claim is still valid and a result may still be recorded.
        """
        if self._completed:
            raise RuntimeError(f"{self!r} already completed its intent in attempt.atomic()")
        # The model comes from the intent: this module is imported before the
        # app registry is ready, and the model's manager checks handlers' kinds,
        # so it cannot import the model itself.
        model: Any = type(self.intent)
        using = self._using or router.db_for_write(model)
        if transaction.get_connection(using).in_atomic_block:
            # Inside an outer transaction the completion would only be durable
            # when that one commits, and the worker would not know if it did.
            raise RuntimeError("attempt.atomic() must not be nested in another transaction")
        with transaction.atomic(using=using):
            yield
            manager = model.objects.db_manager(using)
            if not manager.complete(self.intent.id, self.intent.claim_token):
                self._lost = True
                raise ClaimLost(
                    f"intent {self.intent.id} was fenced before its attempt committed; "
                    "the block's writes were rolled back"
                )
        self._completed = True

    # -- the pool's side: not for handlers ----------------------------------------

    def mark_cancelled(self) -> None:
        """For the pool: ask the handler to stop (a shutdown, or a lost claim).

        Sets ``cancelled`` and wakes ``wait_cancelled()``; the claim still holds.
        """
        with _GUARD:
            self.cancelled.set()
            wakers, self._on_cancel = self._on_cancel, []
        for wake in wakers:
            wake()

    def mark_lost(self) -> None:
        """For the pool: the claim is gone; tell the handler to stop.

        Sets ``lost`` and ``cancelled``, and calls what ``when_lost`` registered:
        an async handler's task is cancelled.
        """
        with _GUARD:
            self._lost = True
            on_lost, self._on_lost = self._on_lost, None
        self.mark_cancelled()
        if on_lost is not None:
            on_lost()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """For the pool: call ``callback`` (once) when the claim is lost, now if it already is.

        The event loop cancels an async handler's task this way; one callback
        per attempt, the last one registered.
        """
        with _GUARD:
            if not self._lost:
                self._on_lost = callback
                return
        callback()
