"""What the partners workload's handlers do: one delivery, the way docs/relaying.md says.

A 429 or 503 becomes a snooze for the seconds the partner asked for
(``retry_after``, SPEC §14), holding the whole target when the kind's
handler says so; a connection error or any other status is an ordinary
failure (backoff, ``MAX_ATTEMPTS``, and the breaker's count where the kind
has one). The session is the relay workload's: one per event loop, with
``BENCH_RELAY_POOL`` connections and a 2 s timeout.
"""

from __future__ import annotations

from typing import Any

from django_intents import Retry

from .relay_calls import PartnerDown, _session


async def deliver(intent: Any, *, hold_target: bool = False) -> None:
    """POST to the intent's target; return on 200, snooze on 429/503, else fail."""
    import aiohttp

    session = await _session()
    params = {"id": intent.event_id, "at": repr(intent.payload["at"])}
    try:
        # POST, as a delivery is: aiohttp sends an idempotent GET again by
        # itself when the connection is reset, two requests for one attempt.
        async with session.post(intent.target, params=params) as response:
            await response.read()
            status, headers = response.status, response.headers
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise PartnerDown(f"{intent.target}: {type(exc).__name__}") from None
    if status in (429, 503):
        # Imported here, not above: the healthy partners never answer 429, so
        # their scenario also runs on a tree from before SPEC §14's names.
        from django_intents import retry_after

        after = retry_after(headers, default=1)
        reason = f"{status} from {intent.target}"
        if hold_target:
            raise Retry(after=after, reason=reason, hold_target=True)
        raise Retry(after=after, reason=reason)
    if status != 200:
        raise PartnerDown(f"{intent.target} answered HTTP {status}")
