"""The rate-limited partner's limiter: at most N deliveries in any one-second window."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class SlidingWindow:
    """Accept at most ``limit`` requests in any ``window`` seconds; refuse the rest.

    Counts only the requests it accepts, as a partner's limiter does: a sender
    that keeps knocking while refused is not locked out for longer. The count
    lives in this process (runserver serves every request from one), like a
    partner's per-node limiter; the partner page's mode lives in the database.
    """

    def __init__(self, window: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._accepted: deque[float] = deque()
        # runserver answers each request on a thread of its own.
        self._lock = threading.Lock()

    def allow(self, limit: int) -> bool:
        """Whether one more request fits under ``limit`` now; if it does, it is counted."""
        with self._lock:
            now = self.clock()
            while self._accepted and self._accepted[0] <= now - self.window:
                self._accepted.popleft()
            if len(self._accepted) >= limit:
                return False
            self._accepted.append(now)
            return True
