"""How an idle pool is woken: a self-pipe alarm, and the threads that ring it.

The pool's loop sleeps in ``select()`` on one end of a socket pair. Anything
that may have made work available rings it: a worker thread that finished (a
slot is free), the listener or the commit watcher below (an intent may have
been enqueued), a signal handler (shut down). Writing one byte to a socket is
safe from a signal handler, where ``threading.Event.set()`` could deadlock on
a lock the interrupted code holds.

The store says how its database can wake a pool (``Backend.wakeup``). Where
it notifies (``LISTEN``), the listener holds a session on a connection of its
own (the pool's connections are closed and reopened between iterations), so
an idle pool starts new work within milliseconds instead of at its next poll.
Behind a pooler in transaction mode a session is not a connection, and a
LISTEN there hears nothing: the listener connects through
``INTENTS["LISTEN_DATABASE"]`` when it is set, and at start-up sends itself a
NOTIFY the way enqueue does; if none arrives, it says so once and leaves the
pool to polling.

Where commits can be watched (``WATCH``), the commit watcher looks every few
milliseconds on a connection of its own and rings the alarm on a change; the
pool then looks (``has_due``, a read) before it claims, so an idle pool still
never takes the write lock for nothing.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Collection

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_intents.conf import get_settings
from django_intents.models import Intent
from django_intents.store import backend_for
from django_intents.store.base import NOTIFY_CHANNEL, Backend
from django_intents.store.wakeups import LISTEN, WATCH, Listening
from django_intents.worker import log

STOP_PAYLOAD = "django-intents-listener-stop"  # not a kind: every listener ignores it


class Alarm:
    """A self-pipe: any thread, or a signal handler, can wake a sleeping loop."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._rung = False  # a byte is on its way since the last sleep woke

    def ring(self) -> None:
        """Wake the loop; a ring already pending since it last woke is enough.

        Worker threads ring once per finished handler: a system call each
        was a tenth of a no-op drain's time. A ring skipped because one is
        pending is never missed: the pending byte ends the next sleep, or the
        sleep that resets the flag has woken and its loop turn comes next.
        """
        if self._rung:
            return
        self._rung = True
        # A full buffer already means "wake up"; a closed one means nobody listens.
        with contextlib.suppress(OSError):
            self._write.send(b"\0")

    def sleep(self, timeout: float) -> None:
        """Sleep until rung or ``timeout`` seconds pass; forget the rings so far."""
        select.select([self._read], [], [], max(timeout, 0.0))
        with contextlib.suppress(OSError):
            while self._read.recv(4096):
                pass
        # After the drain: a ring from now on sends a byte that stays until the
        # next sleep; one skipped before this line is seen by the coming turn.
        self._rung = False

    def close(self) -> None:
        self._read.close()
        self._write.close()


class Waker:
    """A daemon thread that calls ``wake`` when work may have arrived; ``stop()`` ends it."""

    label = ""  # how the pool's start-up line names this kind of wake-up
    thread_name = "intents-waker"

    def __init__(self, *, using: str, wake: Callable[[], None]) -> None:
        self._using = using
        self._backend: Backend = backend_for(connections[using], Intent)
        self._wake = wake
        self._stopped = threading.Event()
        # Set once a LISTEN on the queue's own alias heard a NOTIFY: a session
        # of that alias outlives a transaction, so no pooler in transaction
        # mode stands between (``outage.reuse_connection`` prepares then).
        self.direct = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError

    def _connect(self, alias: str) -> BaseDatabaseWrapper:
        """Open a connection with the alias's settings, but never from a pool.

        A pooled connection would go back to the pool still listening.
        """
        base = connections[alias]
        options = {k: v for k, v in base.settings_dict.get("OPTIONS", {}).items() if k != "pool"}
        wrapper: BaseDatabaseWrapper = type(base)({**base.settings_dict, "OPTIONS": options}, alias)
        wrapper.ensure_connection()
        return wrapper


def start_waker(
    *,
    using: str,
    kinds: Collection[str],
    wake: Callable[[], None],
    on_priority: Callable[[str], None] | None = None,
) -> Waker | None:
    """Start the wake-ups this database offers; ``None`` leaves the pool to polling alone.

    ``on_priority`` is told each kind whose intents of another priority than 0
    became due, where the database says so.
    """
    wakeup = backend_for(connections[using], Intent).wakeup()
    waker: Waker
    if wakeup.how == WATCH:
        waker = CommitWatcher(using=using, wake=wake)
    elif wakeup.how == LISTEN:
        waker = Listener(using=using, kinds=kinds, wake=wake, on_priority=on_priority)
    else:
        if wakeup.why:
            log.warning("%s; polling only", wakeup.why)
        return None
    waker.start()
    return waker


class Listener(Waker):
    """``LISTEN`` on a dedicated connection and call ``wake`` for the pool's kinds.

    A notification of another priority also calls ``on_priority`` with the
    kind: an intent of another priority than 0 is due, and the pool's next
    claim takes it instead of more of priority 0 (``ClaimMemory.hint``).

    A lost connection is reopened with backoff; until it is, the pool's
    polling still finds every intent, only later.

    ``listen`` is the alias the LISTEN connection opens (default:
    ``LISTEN_DATABASE``, else ``using``);
    ``using`` is the queue's, through which enqueue notifies. The first LISTEN
    is proven by a NOTIFY sent through ``using``: without it within
    ``SELF_TEST`` seconds the listener warns once and ends (``fell_back``).
    """

    label = "LISTEN/NOTIFY"
    thread_name = "intents-listener"
    #: How long one wait for notifications lasts: bounds how late ``stop()`` is seen.
    WAIT = 0.5
    #: How long the start-up NOTIFY may take to arrive before LISTEN is given up.
    SELF_TEST = 3.0

    def __init__(
        self,
        *,
        using: str,
        kinds: Collection[str],
        wake: Callable[[], None],
        listen: str | None = None,
        on_priority: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(using=using, wake=wake)
        self._kinds = frozenset(kinds)
        self._on_priority = on_priority
        self._listen = listen or get_settings().listen_alias(using)
        self._proven = False
        self.listening = threading.Event()
        self.fell_back = threading.Event()

    def _run(self) -> None:
        delay, failed = 0.5, False
        while not self._stopped.is_set():
            wrapper = None
            try:
                wrapper = self._connect(self._listen)
                session = self._backend.listen(wrapper)
                if not self._proven and not self._notify_arrives(session):
                    self._fall_back()
                    return
                self._proven = True
                if self._listen == self._using:
                    self.direct.set()
                if failed:
                    log.info("LISTEN connection is back; wake-ups are immediate again")
                else:
                    log.info("listening for new intents (LISTEN %s)", NOTIFY_CHANNEL)
                self.listening.set()
                delay, failed = 0.5, False
                # Anything enqueued while nobody listened is found by this wake-up.
                self._wake()
                self._receive(session)
            except Exception as exc:  # a listener must outlive any error: polling covers
                failed = True
                if self._stopped.is_set():
                    break
                log.warning(
                    "LISTEN connection failed (%s: %s); polling until it is back, retry in %.1f s",
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                    delay,
                )
                self._stopped.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                self.listening.clear()
                if wrapper is not None:
                    with contextlib.suppress(Exception):
                        wrapper.close()

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread, waking it from its wait with a NOTIFY that no pool acts on.

        Without it a stopping pool waits up to ``WAIT`` for the thread: half
        a second of every ``--drain`` run. If the NOTIFY cannot be sent (the
        database is away, or the pool's connection is closed), the wait ends
        by itself.
        """
        self._stopped.set()
        connection = connections[self._using]
        # Only on a connection already open: a stop after an outage must not connect.
        if self._thread.is_alive() and connection.connection is not None:
            with contextlib.suppress(Exception):
                self._backend.notify(connection, STOP_PAYLOAD)
        super().stop(timeout)

    def _receive(self, session: Listening) -> None:
        while not self._stopped.is_set():
            for notification in session.receive(timeout=self.WAIT):
                if self._stopped.is_set():
                    return
                if notification.payload not in self._kinds:
                    continue
                if notification.prioritized and self._on_priority is not None:
                    self._on_priority(notification.payload)
                self._wake()

    def _notify_arrives(self, session: Listening) -> bool:
        """Send a NOTIFY through the queue's alias, as enqueue does; wait for it here."""
        token = f"django-intents-self-test-{secrets.token_hex(8)}"
        sender = self._connect(self._using)
        try:
            self._backend.notify(sender, token)
        finally:
            sender.close()
        deadline = time.monotonic() + self.SELF_TEST
        while not self._stopped.is_set() and (left := deadline - time.monotonic()) > 0:
            for notification in session.receive(timeout=min(left, self.WAIT)):
                if notification.payload == token:
                    return True
                if notification.payload in self._kinds:
                    self._wake()
        return self._stopped.is_set()

    def _fall_back(self) -> None:
        if self._listen == self._using:
            advice = (
                "behind a connection pooler in transaction mode (PgBouncer) LISTEN hears "
                "nothing; set INTENTS['LISTEN_DATABASE'] to an alias that connects directly"
            )
        else:
            advice = f"does {self._listen!r} connect to the same database as {self._using!r}?"
        log.warning(
            "LISTEN on database %r heard no NOTIFY sent through %r within %.0f s: %s. "
            "Polling only: new intents start within the poll interval.",
            self._listen,
            self._using,
            self.SELF_TEST,
            advice,
        )
        self.fell_back.set()


class CommitWatcher(Waker):
    """Call ``wake`` when another connection commits to the database (``Backend.watch_commits``).

    Any commit counts, not only an enqueue, so ``wake`` is called at most once
    per ``INTERVAL``; a busy application costs the pool one index lookup per
    interval, an idle one nothing but this thread's reads of a counter.
    """

    label = "commit watch"
    thread_name = "intents-watcher"
    INTERVAL = 0.005

    def _run(self) -> None:
        wrapper = None
        try:
            wrapper = self._connect(self._using)
            watch = self._backend.watch_commits(wrapper)
            while not self._stopped.wait(self.INTERVAL):
                if watch.changed():
                    self._wake()
        except Exception as exc:  # polling still finds every intent, only later
            log.warning(
                "SQLite commit watcher stopped (%s: %s); polling only",
                type(exc).__name__,
                " ".join(str(exc).split()),
            )
        finally:
            if wrapper is not None:
                with contextlib.suppress(Exception):
                    wrapper.close()
