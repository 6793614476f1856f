"""serve's queue listener waits as the host's does after a receive that found nothing: the
minimum after one that found a message, doubling from there to ``maxPollingInterval``."""

from __future__ import annotations

from outbox.hosting.serve import MIN_POLL_SECONDS, PollWait


def test_the_first_empty_receive_after_a_message_waits_the_minimum_then_doubling() -> None:
    wait = PollWait(maximum=1.0)
    assert [wait.empty() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    wait.found()
    assert wait.empty() == MIN_POLL_SECONDS
    assert wait.empty() == 0.2


def test_a_maximum_below_the_minimum_is_the_wait() -> None:
    wait = PollWait(maximum=0.05)
    assert [wait.empty() for _ in range(3)] == [0.05, 0.05, 0.05]
    wait.found()
    assert wait.empty() == 0.05
