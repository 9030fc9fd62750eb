"""The administrative transitions: what an operator does to intents, one or many at a time.

``retry_now`` and ``cancel`` take an unfinished intent whatever its claim
(a running claimant is fenced: its token matches nothing any more), and leave
finished ones alone. The ``_many`` forms are what the admin's actions run on
a selection: one statement per thousand intents (``backends/admin.py``), not
one per intent, and they return the ids they moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django_intents.rules import states
from django_intents.rules.identity import check_id
from django_intents.store.admin import administer_many
from django_intents.store.clock import now_or

if TYPE_CHECKING:
    from django_intents.store import Backend


class AdministrativeMethods:
    """Mixed into ``IntentManager``, which provides the plumbing below."""

    def _backend(self) -> Backend:
        raise NotImplementedError

    def _alias(self) -> str:
        raise NotImplementedError

    def _moved(self, to: str, kinds: list[str], backend: Backend) -> bool:
        raise NotImplementedError

    def retry_now(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Make an unfinished intent due now; a current claimant loses its claim."""
        now, id = now_or(now, self._alias()), check_id(id)
        backend = self._backend()
        return self._moved(states.State.PENDING, backend.retry_now(id, now=now), backend)

    def cancel(self, id: str, *, now: datetime | None = None) -> bool:  # noqa: A002
        """Cancel an unfinished intent; a current claimant loses its claim."""
        now, id = now_or(now, self._alias()), check_id(id)
        backend = self._backend()
        return self._moved(states.State.CANCELLED, backend.cancel(id, now=now), backend)

    def retry_now_many(self, ids: Iterable[str], *, now: datetime | None = None) -> list[str]:
        """``retry_now`` on each of ``ids``; return the ids it moved, in no particular order."""
        return self._many("retry_now", states.State.PENDING, ids, now)

    def cancel_many(self, ids: Iterable[str], *, now: datetime | None = None) -> list[str]:
        """``cancel`` on each of ``ids``; return the ids it moved, in no particular order."""
        return self._many("cancel", states.State.CANCELLED, ids, now)

    def _many(self, name: str, to: str, ids: Iterable[str], now: datetime | None) -> list[str]:
        if isinstance(ids, str | bytes):
            raise TypeError("ids must be an iterable of ids, not a single string")
        checked = list(dict.fromkeys(check_id(id) for id in ids))
        if not checked:
            return []
        now, backend = now_or(now, self._alias()), self._backend()
        moved = administer_many(backend, name, checked, now=now)
        self._moved(to, [kind for _, kind in moved], backend)
        return [id for id, _ in moved]
