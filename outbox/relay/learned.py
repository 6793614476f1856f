"""Where a new process starts each endpoint's limit: from what the relays before it learned.

Each relay process learns each endpoint's limit of requests in flight (``relay.limits``) and keeps
it in the database (``relay.limit_store``: its own row per endpoint, written at most every few
seconds). On Flex Consumption a new process is the usual case (scale-out, scale to zero); starting
every one at ``INITIAL_LIMIT`` and doubling per round trip threw away what the last one knew. A new
process starts each endpoint from the other relays' rows (pure: ``start``):

- **What the endpoint last accepted**: the limit of the relay that wrote the latest learned row;
  if that relay was pushed back within ``RECENT_SECONDS``, where the push-back left it (its
  ``settled`` limit), not the peak it was refused at. Then it grows by one per round trip, never
  doubling toward what was refused.
- **Aged**: what is above ``INITIAL_LIMIT`` halves every ``HALF_LIFE_SECONDS`` of the row's age
  (one hour: a process that ran a minute ago counts whole, one of the morning little, one of
  yesterday not at all). A receiver is most often deployed and scaled on the scale of hours;
  starting too high costs the receiver a round trip of refusals (each overload halves the
  limit), starting too low costs the relay a round trip per doubling, so an old figure is
  trusted less and less, and never raised.
- **Shared where the endpoint pushed back**: a push-back says the endpoint's capacity is what
  every relay together may send. A new relay then takes what the relays delivering to it now
  (rows written within ``LIVE_SECONDS``, and the starts of relays that started before it) leave
  of that capacity, and at least ``min(INITIAL_LIMIT, learned)``: four processes started at once
  after a scale to zero send the first one's learned limit and three small starts, not four
  times the limit. An endpoint that never pushed back starts each relay from what it accepted.
- **Bounded**: within 1 and the limit's ceiling (the endpoint's ``max_concurrency``, the
  process's slots).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from outbox.relay.limits import INITIAL_LIMIT
from outbox.store.contract import LearnedLimit

# What a learned limit counts above INITIAL_LIMIT halves with each hour of its age.
HALF_LIFE_SECONDS = 3600.0
# A push-back within this long marks the endpoint as one whose capacity the relays share.
RECENT_SECONDS = 3600.0
# A relay whose row was written within this long delivers to the endpoint now (a running relay
# writes its rows at least every ``limit_store.REFRESH_SECONDS`` while it delivers).
LIVE_SECONDS = 150.0


class Start(NamedTuple):
    """Where an endpoint's limit starts in this process."""

    limit: float
    pushed_back: bool  # lately: it grows by one per round trip from there, never doubling


def start(rows: Sequence[LearnedLimit], ceiling: int) -> Start | None:
    """Where an endpoint's limit starts, given the other relays' ``rows`` of it; None: nothing
    was learned of it (``INITIAL_LIMIT``, doubling)."""
    learned = [r for r in rows if r.learned]
    if not learned:
        return None
    latest = min(learned, key=lambda r: r.age)
    limit = aged(_accepted(latest), latest.age)
    live = [r for r in rows if r.age <= LIVE_SECONDS]
    pushed_back = any(_pushed_back(r) for r in (latest, *live) if r.learned)
    if pushed_back:
        capacity = max(limit, sum(r.concurrency for r in live if r.learned))
        left = capacity - sum(r.concurrency for r in live)
        limit = max(min(float(INITIAL_LIMIT), limit), min(left, limit))
    return Start(max(1.0, min(float(ceiling), limit)), pushed_back)


def aged(limit: float, age: float) -> float:
    """``limit`` learned ``age`` seconds ago, as much as it still counts: what is above
    ``INITIAL_LIMIT`` halves every ``HALF_LIFE_SECONDS``; never more than it was."""
    if limit <= INITIAL_LIMIT:
        return limit
    kept: float = 0.5 ** (max(age, 0.0) / HALF_LIFE_SECONDS)
    return INITIAL_LIMIT + (limit - INITIAL_LIMIT) * kept


def _pushed_back(row: LearnedLimit) -> bool:
    return row.pushed_back_ago is not None and row.pushed_back_ago <= RECENT_SECONDS


def _accepted(row: LearnedLimit) -> float:
    """What the endpoint last accepted of the relay that wrote ``row``: after a recent push-back,
    where the push-back left its limit."""
    if _pushed_back(row) and row.settled is not None:
        return min(row.settled, row.concurrency)
    return row.concurrency
