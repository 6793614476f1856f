"""A circuit breaker per endpoint, shared by every relay through the database, acted on at once.

After ``THRESHOLD`` retryable failures in a row (connection errors, timeouts, 408, 429, 5xx)
an endpoint opens for a cool-down (10 s, doubling while it keeps failing, at most 5 min): its
messages are not sent and spend no attempt; they wait, Pending, and those that wait for nothing
else are pushed to the end of the cool-down in one statement, so that leases stop taking them in
front of healthy endpoints' messages. Then one relay claims the probe: one request decides, a
success closing the breaker and a failure opening it again for longer. Any answer that is not a
failure (2xx, 4xx but 408/429) closes it too: the endpoint is there.

This process acts on its own observations at once (a dead endpoint must not hold its slots for
a whole batch) and learns the others' at each lease.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from outbox import store
from outbox.core.errors import DatabaseError
from outbox.core.logs import log_event

logger = logging.getLogger("outbox.breakers")

THRESHOLD = 10
COOL_DOWN_SECONDS = (10.0, 300.0)  # the first cool-down, and the longest
Key = tuple[str, str]  # (event type, endpoint name)


@dataclass(slots=True)
class _Breaker:
    failures: int = 0  # in a row, as far as this process knows
    unsaved: int = 0  # of those, not yet counted in the database
    open_until: float | None = None  # monotonic; None: closed
    probing: bool = False  # another relay's probe is out
    probing_here: bool = False  # this process's probe is out: the rest wait for its answer
    changed: float = 0.0  # when this process last changed it (monotonic)
    writing: int = 0  # its failures being counted in the database now: newer than any lease read


SEND, PROBE = "send", "probe"


class Breakers:
    """The endpoints' breakers as this process knows them."""

    def __init__(self, pool: store.Connection, others: Callable[[Key], Sequence[str]]) -> None:
        self._pool = pool
        self._others = others  # the other endpoints of the key's event type
        self._known: dict[Key, _Breaker] = {}

    def learn(self, seen: Iterable[store.BreakerSeen], as_of: float) -> None:
        """What a lease sent at ``as_of`` (monotonic) read of the database's breakers, the
        others' observations too; what this process changed since is newer and stays."""
        now = time.monotonic()
        fresh: dict[Key, _Breaker] = {}
        for item in seen:
            key = (item.event_type, item.endpoint)
            mine = self._known.get(key)
            if mine is not None and (mine.changed > as_of or mine.writing):
                fresh[key] = mine
                continue
            opened = None if item.reopen_in is None else now + item.reopen_in
            fresh[key] = _Breaker(
                max(item.failures, mine.failures if mine else 0),
                mine.unsaved if mine else 0,
                opened,
                item.probing and not (mine and mine.probing_here),
                bool(mine and mine.probing_here),
                mine.changed if mine else 0.0,
            )
        for key, mine in self._known.items():
            if key not in fresh and (
                mine.changed > as_of or mine.unsaved or mine.probing_here or mine.writing
            ):
                fresh[key] = mine  # newer than what the lease read, or not written yet
        self._known = fresh

    def holds_back(self, key: Key) -> bool:
        """Whether ``key``'s deliveries wait for this process's probe to be answered."""
        breaker = self._known.get(key)
        return breaker is not None and breaker.probing_here

    def verdict(self, key: Key) -> str | float:
        """``SEND``; ``PROBE`` (the cool-down is over: claim the probe first); or the seconds
        until the endpoint may be tried again."""
        breaker = self._known.get(key)
        if breaker is None or breaker.open_until is None:
            return SEND
        left = breaker.open_until - time.monotonic()
        if left > 0:
            return left
        return 1.0 if breaker.probing or breaker.probing_here else PROBE

    async def claim_probe(self, key: Key, seconds: float) -> bool:
        """Whether this process sends the probe of ``key`` (no other relay does), claiming it
        for ``seconds`` (the probe's timeout); meanwhile the rest wait here for its answer."""
        self._touch(key).probing_here = True  # before the claim: no second one from here
        claimed = False
        try:
            claimed = await store.claim_probe(self._pool, key, seconds)
        except DatabaseError:
            pass
        finally:  # also when cancelled: then the database's word is awaited from the next lease
            # Looked up again: a lease that returned meanwhile may have replaced the breaker.
            breaker = self._touch(key)
            breaker.probing_here, breaker.probing = claimed, not claimed
        breaker.changed = time.monotonic()
        return claimed

    def observed(self, key: Key, unwell: bool | None, *, probe: bool) -> Awaitable[None] | None:
        """What a delivery to ``key`` came to: ``unwell`` (counts), answered, or never sent.
        Returns what to await when the database must hear of it at once (the breaker closed, or
        opened here), else None: the usual answer costs no database write and no coroutine."""
        if unwell is None:
            if probe:  # the probe was not even sent: another delivery may probe
                self._touch(key).probing_here = False
            return None
        breaker = self._touch(key)
        if probe:
            breaker.probing_here = False
        if not unwell:
            if breaker.failures or breaker.open_until is not None or probe:
                self._known.pop(key, None)
                return self._closed(key)
            return None
        breaker.failures += 1
        breaker.unsaved += 1
        if probe or (breaker.open_until is None and breaker.failures >= THRESHOLD):
            # Open here at once; the database says for how long, and tells the others.
            breaker.open_until = time.monotonic() + COOL_DOWN_SECONDS[0]
            return self._count(key, breaker, probe_failed=probe, announce=True)
        return None

    async def _closed(self, key: Key) -> None:
        await self._save(store.endpoint_recovered(self._pool, key))
        log_event(logger, logging.INFO, "outbox.breaker", endpoint=key[1], state="closed")

    def _touch(self, key: Key) -> _Breaker:
        breaker = self._known.get(key)
        if breaker is None:
            breaker = self._known[key] = _Breaker()
        breaker.changed = time.monotonic()
        return breaker

    async def flush(self) -> None:
        """Count in the database the failures seen here and not yet counted (at each batch)."""
        for key, breaker in list(self._known.items()):
            if breaker.unsaved:
                await self._count(key, breaker, probe_failed=False, announce=False)

    async def _count(
        self, key: Key, breaker: _Breaker, *, probe_failed: bool, announce: bool
    ) -> None:
        """Write the failures not yet counted; ``announce``: this process just opened it."""
        failures, breaker.unsaved = breaker.unsaved, 0
        breaker.writing += 1
        try:
            reopen_in = await store.endpoint_failed(
                self._pool,
                key,
                failures,
                threshold=THRESHOLD,
                probe_failed=probe_failed,
                cool_down=COOL_DOWN_SECONDS,
                others=self._others(key),
            )
        except DatabaseError as exc:
            logger.warning("outbox: breaker of %s not saved (%s)", key[1], exc.kind)
            breaker.unsaved += failures
            reopen_in = None
        finally:
            breaker.writing -= 1
        breaker.changed = time.monotonic()
        if reopen_in is not None:
            breaker.open_until = time.monotonic() + reopen_in
            breaker.probing = False
            if announce:
                state = "reopened" if probe_failed else "open"
                log_event(
                    logger,
                    logging.WARNING,
                    "outbox.breaker",
                    event_type=key[0],
                    endpoint=key[1],
                    state=state,
                    failures=breaker.failures,
                    reopen_in_s=round(reopen_in, 1),
                )

    @staticmethod
    async def _save(write: Awaitable[None]) -> None:
        try:
            await write
        except DatabaseError as exc:
            logger.warning("outbox: breaker state not saved (%s)", exc.kind)
