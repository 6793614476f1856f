"""The breakers' one writer: what the book (``outbox.relay.breakers``) decides, via the store.

The delivery path asks the book (``BreakerWriter.book``: pure, no I/O) whether an endpoint may be
sent to and what an answer changes; when the book says the database must hear of it (a count of
failures, a breaker closed, a probe to claim), this writer makes the store's call, logs the
breaker's change, and hands the store's answer back to the book. A database error here costs the
breaker's news, never the delivery: it is logged and the book keeps what it knows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from outbox.core.errors import DatabaseError
from outbox.core.logs import log_event
from outbox.relay.breakers import COOL_DOWN_SECONDS, THRESHOLD, BreakerBook, Close, Count, Key
from outbox.store.contract import RelayStore

logger = logging.getLogger("outbox.breakers")
# How often a run that is delivering reads which endpoints an operator paused: a pause stops new
# requests within about this long, whatever the run had leased (the next lease may be far off).
PAUSE_CHECK_SECONDS = 1.0


class BreakerWriter:
    """The endpoints' breakers of this process (``book``) and their writes to the database."""

    def __init__(
        self,
        relay_store: RelayStore,
        others: Callable[[Key], Sequence[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = relay_store
        self._others = others  # the other endpoints of the key's event type
        # What the lease and the delivery path ask (pure: answered without the database).
        self.book = BreakerBook(clock)

    async def claim_probe(self, key: Key, seconds: float) -> bool:
        """Whether this process sends the probe of ``key`` (no other relay does), claiming it
        for ``seconds`` (the probe's timeout); meanwhile the rest wait here for its answer."""
        self.book.claiming(key)  # before the claim: no second one from here
        claimed = False
        try:
            claimed = await self._store.claim_probe(key, seconds)
        except DatabaseError:
            pass
        finally:  # also when cancelled: then the database's word is awaited from the next lease
            self.book.claimed(key, claimed)
        return claimed

    async def watch_pauses(self, every: float = PAUSE_CHECK_SECONDS) -> None:
        """Read the paused endpoints every ``every`` seconds until cancelled (a run's whole
        length). A database error skips a reading: the last one, or the lease's, stands."""
        while True:
            await asyncio.sleep(every)
            try:
                self.book.learn_paused(await self._store.paused_keys())
            except DatabaseError:
                continue

    async def write(self, decision: Count | Close) -> None:
        """Persist what the book decided (``BreakerBook.observed``)."""
        if isinstance(decision, Close):
            await self._closed(decision.key)
        else:
            await self._count(decision)

    async def flush(self) -> None:
        """Count in the database the failures seen here and not yet counted (at each batch)."""
        for key, breaker in self.book.unsaved():
            count = self.book.count_unsaved(key, breaker)
            if count is not None:
                await self._count(count)

    async def _closed(self, key: Key) -> None:
        try:
            await self._store.endpoint_recovered(key)
        except DatabaseError as exc:
            logger.warning("outbox: breaker state not saved (%s)", exc.kind)
        log_event(logger, logging.INFO, "outbox.breaker", endpoint=key[1], state="closed")

    async def _count(self, count: Count) -> None:
        """Write the failures not yet counted; announce the breaker opened by this process."""
        key = count.key
        try:
            reopen_in = await self._store.endpoint_failed(
                key,
                count.failures,
                threshold=THRESHOLD,
                probe_failed=count.probe_failed,
                cool_down=COOL_DOWN_SECONDS,
                others=self._others(key),
            )
        except DatabaseError as exc:
            logger.warning("outbox: breaker of %s not saved (%s)", key[1], exc.kind)
            self.book.not_written(count)
            return
        except BaseException:
            self.book.abandoned(count)
            raise
        self.book.written(count, reopen_in)
        if reopen_in is not None and count.announce:
            log_event(
                logger,
                logging.WARNING,
                "outbox.breaker",
                event_type=key[0],
                endpoint=key[1],
                state="reopened" if count.probe_failed else "open",
                failures=count.breaker.failures,
                reopen_in_s=round(reopen_in, 1),
            )
