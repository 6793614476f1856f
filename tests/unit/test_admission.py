"""How much a run may lease, from the process's waiting messages and its pace of requests."""

from __future__ import annotations

from outbox.admission import Admission


def test_before_any_request_finished_one_batch_is_leased_to_learn_the_pace() -> None:
    admission = Admission(concurrency=4)
    assert admission.room(within=10, batch_size=100) == 100
    admission.reserve(100)
    assert admission.room(within=10, batch_size=100) == 0  # nothing more until the pace is known


def test_a_run_leases_what_the_slots_can_start_in_time_less_what_waits() -> None:
    admission = Admission(concurrency=4)
    admission.finished(0.1)  # 40 requests a second
    assert admission.room(within=1.0, batch_size=100) == 40
    admission.reserve(30)
    assert admission.room(within=1.0, batch_size=100) == 10
    assert admission.room(within=0.5, batch_size=100) == 0
    admission.release(30)
    assert admission.room(within=100, batch_size=100) == 100  # never more than a batch


def test_the_pace_follows_the_requests_smoothly() -> None:
    admission = Admission(concurrency=1)
    admission.finished(1.0)
    for _ in range(30):
        admission.finished(0.01)
    assert admission.pace is not None
    assert 0.01 <= admission.pace < 0.02
