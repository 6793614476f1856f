"""Each endpoint's adaptive limit of requests in flight: what the endpoint sustains.

The process may have ``OUTBOX_CONCURRENCY`` requests in flight; one endpoint gets no more than
its limit of them. The limit starts at ``INITIAL_LIMIT`` (never above the endpoint's
``max_concurrency`` or the process's slots) and follows the endpoint's answers, as TCP's
congestion window follows a path (additive increase, multiplicative decrease):

- an answer below 500 other than 429, while the endpoint's smoothed latency holds (within
  ``LATENCY_TOLERANCE`` of its baseline), raises the limit: by one per answer until the first
  overload (it doubles every round trip), then by one per round trip (``1/limit`` per answer).
  The baseline is the lowest smoothed latency, drifting up slowly (``BASELINE_DRIFT`` per
  answer) toward the latency now: a latency that rose for good, or a minimum that was only
  noise, stops the growth for a while, never for ever;
- an overload (429, 502, 503, 504, a timeout or a connection error) halves it, at most once per
  round trip (the answers to requests sent before the halving say nothing new), never below 1;
  halves what was in flight, if that was less (TCP halves its flight size, not its window: a
  limit that grew while the relay sent fewer was never accepted);
- any other answer (500, …) leaves it as it is.

A receiver that answers slowly thus gets many requests at once while it keeps answering at the
same pace, and one that pushes back gets fewer, each endpoint for itself.

A process need not start from ``INITIAL_LIMIT``: where relays before it learned the endpoint's
limit, it ``resume``s from what they learned (``relay.learned`` decides where; ``relay.limit_store``
reads and keeps it). Each limit keeps what that needs: where its last overload left it
(``settled``), when (``pushed_back_at``), how many answers it followed (``answers``), and the most
requests in flight it saw served (``peak``: a limit grows with each answer, also while fewer are
sent, so the limit alone is not what the endpoint accepted).

Fast path: one ``answered`` call per request, a few float operations; no allocation.
"""

from __future__ import annotations

from outbox.core.models import DeliveryResult, Response, TransportError

# Requests in flight an endpoint starts with (what the relay sent at once before it adapted).
INITIAL_LIMIT = 16
# Latency may grow to this multiple of the endpoint's lowest before the limit stops growing.
LATENCY_TOLERANCE = 2.0
# How much of each answer's latency the smoothed latency takes in.
LATENCY_WEIGHT = 0.1
# How much of the distance to the smoothed latency the baseline moves up per answer.
BASELINE_DRIFT = 0.01
# What an overload leaves of the limit.
DECREASE = 0.5
# Answers that say the endpoint has more than it can take.
OVERLOAD_STATUSES = frozenset({429, 502, 503, 504})


class AdaptiveLimit:
    """One endpoint's limit of requests in flight (``limit``, at least 1, at most ``ceiling``)."""

    __slots__ = (
        "_best",
        "_calm_until",
        "_latency",
        "_threshold",
        "answers",
        "ceiling",
        "limit",
        "peak",
        "pushed_back_at",
        "settled",
    )

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = float(min(INITIAL_LIMIT, ceiling))
        self._threshold = float(ceiling)  # below it, the limit grows by one per answer
        self._latency: float | None = None  # smoothed, seconds
        self._best: float | None = None  # the baseline: the lowest smoothed latency, drifting
        self._calm_until = 0.0  # monotonic: overloads before this are the same overload
        self.answers = 0  # answers it followed (served or overloaded)
        # The most requests in flight at an answer served, since ``limit_store`` last kept it
        # (and reset it): what the endpoint accepted, where the limit may have grown unused.
        self.peak = 0.0
        self.settled: float | None = None  # what the last overload left of the limit
        self.pushed_back_at: float | None = None  # monotonic: when that overload came

    def resume(self, limit: float, *, pushed_back: bool) -> None:
        """Start from ``limit``, learned before this process (within 1 and the ceiling) instead of
        ``INITIAL_LIMIT``; ``pushed_back``: the endpoint pushed back lately, so the limit grows by
        one per round trip from there, never doubling toward what it refused."""
        self.limit = max(1.0, min(float(self.ceiling), limit))
        if pushed_back:
            self._threshold = self.limit

    def allows(self, in_flight: int) -> bool:
        """Whether one more request may start with ``in_flight`` already sent."""
        return in_flight < self.limit

    def answered(
        self, result: DeliveryResult, seconds: float, now: float, in_flight: int | None = None
    ) -> None:
        """A request sent to the endpoint came back with ``result`` after ``seconds``, at
        ``now`` (monotonic), with ``in_flight`` requests to it in flight (itself included;
        None: as many as the limit)."""
        if isinstance(result, Response):
            if result.status in OVERLOAD_STATUSES:
                self._overloaded(seconds, now, in_flight)
            elif result.status < 500:
                self._served(seconds)
                self.peak = max(self.peak, self.limit if in_flight is None else in_flight)
        elif isinstance(result, TransportError):
            self._overloaded(seconds, now, in_flight)

    def _served(self, seconds: float) -> None:
        self.answers += 1
        latency = self._latency
        latency = seconds if latency is None else latency + LATENCY_WEIGHT * (seconds - latency)
        self._latency = latency
        best = self._best
        if best is None or latency < best:
            best = latency
        else:
            best += BASELINE_DRIFT * (latency - best)
        self._best = best
        if latency > LATENCY_TOLERANCE * best or self.limit >= self.ceiling:
            return
        step = 1.0 if self.limit < self._threshold else 1.0 / self.limit
        self.limit = min(float(self.ceiling), self.limit + step)

    def _overloaded(self, seconds: float, now: float, in_flight: int | None) -> None:
        self.answers += 1
        if now < self._calm_until:
            return
        sent = self.limit if in_flight is None else min(self.limit, float(in_flight))
        self.limit = max(1.0, sent * DECREASE)
        self._threshold = self.limit
        self._calm_until = now + max(self._latency or 0.0, seconds)
        self.settled, self.pushed_back_at = self.limit, now
