"""A circuit breaker per endpoint: the policy, as a pure state machine (no I/O, its clock injected).

After ``THRESHOLD`` retryable failures in a row (connection errors, timeouts, 408, 429, 5xx)
an endpoint opens for a cool-down (10 s, doubling while it keeps failing, at most 5 min): its
messages are not sent and spend no attempt; they wait, Pending, and those that wait for nothing
else are pushed to the end of the cool-down in one statement, so that leases stop taking them in
front of healthy endpoints' messages. Then one relay claims the probe: one request decides, a
success closing the breaker and a failure opening it again for longer. Any answer that is not a
failure (2xx, 4xx but 408/429) closes it too: the endpoint is there.

An endpoint paused by an operator (``outbox_paused_endpoints``, read by each lease with the
breakers, and about once a second while a run delivers) is refused the same way, for
``PAUSED_RETRY_SECONDS`` at a time, until it is resumed: requests in flight finish, those not
started yet are not made.

The breakers are shared by every relay through the database. ``BreakerBook`` is what this
process knows of them: it acts on its own observations at once (a dead endpoint must not hold its
slots for a whole batch), learns the others' at each lease, and says what the database must hear
(a ``Count`` of failures, a ``Close``); ``outbox.relay.breaker_store`` writes that and tells the
book how it went. The database counts the failures and computes the cool-down (its doubling
included): the book opens at once for the first cool-down and takes the database's word after.

Fast path (docs/performance.md § "The relay's own CPU", its table of changes): an answer from a
healthy endpoint changes nothing to write: ``observed`` returns None, and the delivery awaits
nothing ("a healthy endpoint's breaker costs no coroutine").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

THRESHOLD = 10
# How long a delivery to an endpoint paused by an operator waits before it is looked at again
# (resuming makes its messages due at once, whatever this says).
PAUSED_RETRY_SECONDS = 300.0
COOL_DOWN_SECONDS = (10.0, 300.0)  # the first cool-down, and the longest
Key = tuple[str, str]  # (event type, endpoint name)
SEND, PROBE = "send", "probe"


class Seen(Protocol):
    """A breaker as a lease read it from the database (``store.contract.BreakerSeen``)."""

    @property
    def event_type(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def failures(self) -> int: ...
    @property
    def reopen_in(self) -> float | None: ...
    @property
    def probing(self) -> bool: ...
    @property
    def paused(self) -> bool: ...


@dataclass(slots=True)
class Breaker:
    """One endpoint's breaker as this process knows it."""

    failures: int = 0  # in a row, as far as this process knows
    unsaved: int = 0  # of those, not yet counted in the database
    open_until: float | None = None  # on the book's clock; None: closed
    probing: bool = False  # another relay's probe is out
    probing_here: bool = False  # this process's probe is out: the rest wait for its answer
    changed: float = 0.0  # when this process last changed it (the book's clock)
    writing: int = 0  # its failures being counted in the database now: newer than any lease read


@dataclass(frozen=True, slots=True)
class Count:
    """Failures seen here to count in the database (``RelayStore.endpoint_failed``); ``announce``:
    this process just opened the breaker. Hand it back with ``written``, ``not_written`` or
    ``abandoned``: until then the breaker is being written, and no lease's view replaces it."""

    key: Key
    failures: int
    probe_failed: bool
    announce: bool
    breaker: Breaker


@dataclass(frozen=True, slots=True)
class Close:
    """The endpoint answered: its breaker closes (``RelayStore.endpoint_recovered``)."""

    key: Key


Decision = Count | Close


class BreakerBook:
    """The endpoints' breakers as this process knows them; ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._known: dict[Key, Breaker] = {}
        self._paused: frozenset[Key] = frozenset()  # paused by an operator, as the lease read

    def learn(self, seen: Iterable[Seen], as_of: float) -> None:
        """What a lease sent at ``as_of`` (the book's clock) read of the database's breakers, the
        others' observations too; what this process changed since, or is writing, is newer and
        stays."""
        now = self._clock()
        fresh: dict[Key, Breaker] = {}
        seen = list(seen)
        self._paused = frozenset((i.event_type, i.endpoint) for i in seen if i.paused)
        for item in seen:
            key = (item.event_type, item.endpoint)
            mine = self._known.get(key)
            if mine is not None and (mine.changed > as_of or mine.writing):
                fresh[key] = mine
                continue
            opened = None if item.reopen_in is None else now + item.reopen_in
            fresh[key] = Breaker(
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

    def learn_paused(self, paused: frozenset[Key]) -> None:
        """The endpoints paused now, read between leases (``BreakerWriter.watch_pauses``)."""
        self._paused = paused

    def holds_back(self, key: Key) -> bool:
        """Whether ``key``'s deliveries wait for this process's probe to be answered."""
        breaker = self._known.get(key)
        return breaker is not None and breaker.probing_here

    def paused(self, key: Key) -> bool:
        """Whether an operator paused ``key`` (as the last lease read it)."""
        return key in self._paused

    def verdict(self, key: Key) -> str | float:
        """``SEND``; ``PROBE`` (the cool-down is over: claim the probe first); or the seconds
        until the endpoint may be tried again (paused by an operator: until looked at again)."""
        if key in self._paused:
            return PAUSED_RETRY_SECONDS
        breaker = self._known.get(key)
        if breaker is None or breaker.open_until is None:
            return SEND
        left = breaker.open_until - self._clock()
        if left > 0:
            return left
        return 1.0 if breaker.probing or breaker.probing_here else PROBE

    def claiming(self, key: Key) -> None:
        """This process claims ``key``'s probe: no second claim from here, and its other
        deliveries wait for the probe's answer."""
        self._touch(key).probing_here = True

    def claimed(self, key: Key, claimed: bool) -> None:
        """The claim's answer: this process probes, or another relay does (also after a failed
        or cancelled claim: the database's word is then awaited from the next lease)."""
        # Looked up again: a lease that returned meanwhile may have replaced the breaker.
        breaker = self._touch(key)
        breaker.probing_here, breaker.probing = claimed, not claimed

    def observed(self, key: Key, unwell: bool | None, *, probe: bool) -> Decision | None:
        """What a delivery to ``key`` came to: ``unwell`` (counts), answered, or never sent; and
        what the database must hear of it at once (the breaker closed, or opened here), if
        anything: the usual answer changes nothing to write."""
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
                return Close(key)
            return None
        breaker.failures += 1
        breaker.unsaved += 1
        if probe or (breaker.open_until is None and breaker.failures >= THRESHOLD):
            # Open here at once; the database says for how long, and tells the others.
            breaker.open_until = self._clock() + COOL_DOWN_SECONDS[0]
            return self._count(key, breaker, probe_failed=probe, announce=True)
        return None

    def unsaved(self) -> list[tuple[Key, Breaker]]:
        """The breakers as now, to count in the database what each saw and did not yet count
        (``count_unsaved`` each in turn)."""
        return list(self._known.items())

    def count_unsaved(self, key: Key, breaker: Breaker) -> Count | None:
        """The failures ``breaker`` saw that the database has not counted, if any."""
        if not breaker.unsaved:
            return None
        return self._count(key, breaker, probe_failed=False, announce=False)

    def written(self, count: Count, reopen_in: float | None) -> None:
        """The database counted ``count``: the breaker is open for ``reopen_in`` seconds more,
        whoever opened it, or None: not open."""
        breaker = count.breaker
        breaker.writing -= 1
        breaker.changed = self._clock()
        if reopen_in is not None:
            breaker.open_until = self._clock() + reopen_in
            breaker.probing = False

    def not_written(self, count: Count) -> None:
        """The database did not count ``count``: counted again with the next ones."""
        breaker = count.breaker
        breaker.unsaved += count.failures
        breaker.writing -= 1
        breaker.changed = self._clock()

    def abandoned(self, count: Count) -> None:
        """The write of ``count`` was cancelled: no longer being written."""
        count.breaker.writing -= 1

    def _count(self, key: Key, breaker: Breaker, *, probe_failed: bool, announce: bool) -> Count:
        count = Count(key, breaker.unsaved, probe_failed, announce, breaker)
        breaker.unsaved = 0
        breaker.writing += 1
        return count

    def _touch(self, key: Key) -> Breaker:
        breaker = self._known.get(key)
        if breaker is None:
            breaker = self._known[key] = Breaker()
        breaker.changed = self._clock()
        return breaker
