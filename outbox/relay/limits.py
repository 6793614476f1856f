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
- any other answer (500, …) leaves it as it is.

A receiver that answers slowly thus gets many requests at once while it keeps answering at the
same pace, and one that pushes back gets fewer, each endpoint for itself.

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

    __slots__ = ("_best", "_calm_until", "_latency", "_threshold", "ceiling", "limit")

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = float(min(INITIAL_LIMIT, ceiling))
        self._threshold = float(ceiling)  # below it, the limit grows by one per answer
        self._latency: float | None = None  # smoothed, seconds
        self._best: float | None = None  # the baseline: the lowest smoothed latency, drifting
        self._calm_until = 0.0  # monotonic: overloads before this are the same overload

    def allows(self, in_flight: int) -> bool:
        """Whether one more request may start with ``in_flight`` already sent."""
        return in_flight < self.limit

    def answered(self, result: DeliveryResult, seconds: float, now: float) -> None:
        """A request sent to the endpoint came back with ``result`` after ``seconds``, at
        ``now`` (monotonic)."""
        if isinstance(result, Response):
            if result.status in OVERLOAD_STATUSES:
                self._overloaded(seconds, now)
            elif result.status < 500:
                self._served(seconds)
        elif isinstance(result, TransportError):
            self._overloaded(seconds, now)

    def _served(self, seconds: float) -> None:
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

    def _overloaded(self, seconds: float, now: float) -> None:
        if now < self._calm_until:
            return
        self.limit = max(1.0, self.limit * DECREASE)
        self._threshold = self.limit
        self._calm_until = now + max(self._latency or 0.0, seconds)
