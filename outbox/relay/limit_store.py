"""The learned limits' keeper: what this process starts each endpoint from, and what it keeps.

Before its first lease a processor ``start``s: the store reads the other relays' rows of its
endpoints, one starting relay at a time, and ``relay.learned`` says where each limit starts; the
starts that came from a learned row are kept as this relay's (not yet learned), so that a relay
starting next shares with it, and logged (``outbox.limit endpoint=… started=…``).
While it delivers, ``save`` keeps the limits that changed:

- at most one write every ``WRITE_SECONDS`` (one statement for all the endpoints that changed),
  whatever the number of batches, runs or answers;
- for an endpoint only once it has followed an answer since its last write, and only when what it
  accepted moved by a quarter (at least one request) or it was pushed back since, or its row is
  ``REFRESH_SECONDS`` old (so that the starting relays count it among those delivering now:
  ``learned.LIVE_SECONDS``);
- what it accepted: its limit, but no more than the most requests in flight it saw served since
  the last write (``AdaptiveLimit.peak``; at least ``INITIAL_LIMIT``, where a new process would
  start anyway): a limit that grew with answers while fewer were sent was never accepted.

When the process closes (``Relay.close``), what changed is written once more, whatever the time.
A database error here costs the limits' news, never a delivery: it is logged, and the start is
tried again at the next run (its endpoints then start where they are, if they learned nothing
meanwhile); any other error is logged as the bug it is, and the process goes on from 16.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import NamedTuple

from outbox.core.errors import DatabaseError, describe
from outbox.core.logs import log_event
from outbox.relay import learned
from outbox.relay.breakers import Key
from outbox.relay.limits import INITIAL_LIMIT, AdaptiveLimit
from outbox.store.contract import LearnedLimit, OwnLimit, RelayStore

logger = logging.getLogger("outbox.limits")

# At most one write of the process's limits this often.
WRITE_SECONDS = 5.0
# A change smaller than this share of the limit written (and than one request) is not written.
CHANGE = 0.25
# An endpoint still delivered to has its row written at least this often.
REFRESH_SECONDS = 60.0


class Written(NamedTuple):
    """What this process last wrote of an endpoint's limit."""

    limit: float  # what it accepted (``accepted``)
    pushed_back_at: float | None  # monotonic
    answers: int  # the limit's count of answers then
    at: float  # monotonic


class LimitKeeper:
    """This process's learned limits (``limits``, per endpoint) and their rows in the store."""

    def __init__(
        self,
        relay_store: RelayStore,
        limits: dict[Key, AdaptiveLimit],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = relay_store
        self._limits = limits
        self._clock = clock
        self.relay = uuid.uuid4()  # this process, in outbox_endpoint_limits
        # Nothing written yet: the first answer makes an endpoint's row worth writing.
        self._written = {k: Written(accepted(lim), None, 0, -math.inf) for k, lim in limits.items()}
        self._started = False
        self._starting = asyncio.Lock()
        self._last_write = -math.inf
        self._writing = False

    async def start(self) -> None:
        """Start each endpoint's limit from what the relays before this one learned (once per
        process; again at the next run after a database error)."""
        async with self._starting:
            if self._started or not self._limits:
                return
            try:
                kept = await self._store.start_limits(
                    self.relay, list(self._limits), self._starts, live_seconds=learned.LIVE_SECONDS
                )
            except DatabaseError as exc:  # tried again at the next run
                logger.warning("outbox: learned limits not read (%s): starting at 16", exc.kind)
                return
            except Exception as exc:  # noqa: BLE001 - a bug: said, and never a delivery's cost
                self._started = True
                logger.error("outbox: learned limits not read: %s", describe(exc))
                return
            self._started = True
        now = self._clock()
        for own in kept:
            key = (own.event_type, own.endpoint)
            self._written[key] = Written(own.concurrency, None, 0, now)
            log_event(
                logger,
                logging.INFO,
                "outbox.limit",
                event_type=key[0],
                endpoint=key[1],
                started=round(own.concurrency, 1),
            )

    def _starts(self, rows: Sequence[LearnedLimit]) -> list[OwnLimit]:
        """Where each endpoint starts (resumed here, unless it learned something meanwhile), and
        the starts to keep: those that came from a learned row."""
        by_key: dict[Key, list[LearnedLimit]] = {}
        for row in rows:
            by_key.setdefault((row.event_type, row.endpoint), []).append(row)
        kept = []
        for key, found in by_key.items():
            limit = self._limits.get(key)
            begin = learned.start(found, limit.ceiling) if limit is not None else None
            if limit is None or begin is None or limit.answers:
                continue
            limit.resume(begin.limit, pushed_back=begin.pushed_back)
            kept.append(OwnLimit(*key, limit.limit, None, None, learned=False))
        return kept

    async def save(self, *, closing: bool = False) -> None:
        """Write the limits that changed, if ``WRITE_SECONDS`` passed since the last write (or
        the process is ``closing``)."""
        now = self._clock()
        if self._writing or (now - self._last_write < WRITE_SECONDS and not closing):
            return
        changed = [(key, limit) for key, limit in self._limits.items() if self._worth(key, now)]
        if not changed:
            return
        self._writing, self._last_write = True, now
        own = [self._own(key, limit, now) for key, limit in changed]
        try:
            await self._store.save_limits(self.relay, own)
        except DatabaseError as exc:
            logger.warning("outbox: learned limits not saved (%s)", exc.kind)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: said, and never a delivery's cost
            logger.error("outbox: learned limits not saved: %s", describe(exc))
            return
        finally:
            self._writing = False
        for (key, limit), kept in zip(changed, own, strict=True):
            self._written[key] = Written(kept.concurrency, limit.pushed_back_at, limit.answers, now)
            limit.peak = 0.0  # what it accepts from now on

    def _worth(self, key: Key, now: float) -> bool:
        """Whether the limit of ``key`` is worth a write at ``now``."""
        limit, written = self._limits[key], self._written[key]
        if limit.answers == written.answers:
            return False
        moved = abs(accepted(limit) - written.limit) >= max(1.0, CHANGE * written.limit)
        pushed = limit.pushed_back_at != written.pushed_back_at
        return moved or pushed or now - written.at >= REFRESH_SECONDS

    @staticmethod
    def _own(key: Key, limit: AdaptiveLimit, now: float) -> OwnLimit:
        ago = None if limit.pushed_back_at is None else max(0.0, now - limit.pushed_back_at)
        return OwnLimit(*key, accepted(limit), limit.settled, ago, learned=True)


def accepted(limit: AdaptiveLimit) -> float:
    """What the endpoint accepted of ``limit`` lately: the limit, within the most requests in
    flight served since the last write (at least ``INITIAL_LIMIT``)."""
    return min(limit.limit, max(limit.peak, float(INITIAL_LIMIT)))
