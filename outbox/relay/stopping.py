"""When a run stops: the rule of a drain, and the rule of a wake-up hint's run.

A run leases batch after batch. After a lease that comes back short (the run has caught up with
what was due) and once that batch's deliveries are done, the drain loop asks its rule whether
to stop. A drain (timer, HTTP, command) never stops there: it leases again, and ends on a lease
that finds nothing while nothing is in flight. A hint's run stops there, unless what it recorded
is due again already or let the next message of an ordering key go: under steady load it would
otherwise last its whole budget while the hints of rows committed later queue up behind it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Protocol

from outbox.core.models import Recorded, Status


class StopRule(Protocol):
    """What a run's drain loop consults; one per run (it may keep what the run recorded)."""

    # Whether the run starts by letting go what a change outside the relay left parked.
    sweeps: bool

    def recorded(self, records: Sequence[Recorded], lets_next_go: bool) -> None:
        """A batch's outcomes were written; ``lets_next_go``: one of them let the next message
        of its ordering key go."""

    def caught_up(self) -> bool:
        """After a short lease whose deliveries are done: stop now? (Resets what was kept.)"""


class UntilEmpty:
    """A drain: lease until a lease finds nothing."""

    sweeps = True

    def recorded(self, records: Sequence[Recorded], lets_next_go: bool) -> None:
        pass

    def caught_up(self) -> bool:
        return False


class UntilCaughtUp:
    """A wake-up hint's run: stop once caught up, unless one more lease would find what the run
    itself gave back, retried shortly, or let go."""

    sweeps = False

    def __init__(self) -> None:
        self.let_next_go = False
        # When the first outcome that stays due comes due again (monotonic).
        self.due_again = math.inf

    def recorded(self, records: Sequence[Recorded], lets_next_go: bool) -> None:
        self.let_next_go |= lets_next_go
        now = time.monotonic()
        for record in records:
            outcome = record.outcome
            if outcome.status is Status.PENDING:
                due = now if outcome.not_attempted else now + outcome.delay_seconds
                self.due_again = min(self.due_again, due)

    def caught_up(self) -> bool:
        done = not self.let_next_go and self.due_again > time.monotonic()
        self.let_next_go, self.due_again = False, math.inf
        return done


def stop_rule(*, until_caught_up: bool) -> StopRule:
    return UntilCaughtUp() if until_caught_up else UntilEmpty()


class StopSignal:
    """Whether the processor was told to stop (``OutboxProcessor.stop``): its runs lease no more
    and start no delivery more. Shared by the processor's parts; never reset."""

    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False
