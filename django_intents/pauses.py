"""Paused kinds: the manager's ``pause``, ``resume`` and ``paused`` (SPEC §11).

A pause is a row in ``PausedKind``. Every claim and due probe leaves paused
kinds out in its own statement (``Backend.filters``), so a pool learns of a
pause at its next claim, with no query of its own; the attempts already
running finish normally, and enqueue keeps recording.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django_intents.rules.identity import check_text
from django_intents.store.clock import now_or

if TYPE_CHECKING:
    from django_intents.store import Backend


class PauseMethods:
    """Mixed into ``IntentManager``, which provides ``_backend()``."""

    def _backend(self) -> Backend:
        raise NotImplementedError

    def _alias(self) -> str:
        raise NotImplementedError

    def pause(self, kind: str, *, now: datetime | None = None) -> bool:
        """Stop every claim of ``kind`` from the next one on; ``True`` if it was not paused."""
        kind, now = check_text("kind", kind), now_or(now, self._alias())
        return self._backend().pause(kind, now=now)

    def resume(self, kind: str) -> bool:
        """Let claims take ``kind`` again; ``True`` if it was paused."""
        return self._backend().resume(check_text("kind", kind))

    def paused(self) -> set[str]:
        """The kinds paused now."""
        return self._backend().paused()
