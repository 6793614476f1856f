"""The collector's thresholds in a process that hosts the relay (``tune_garbage_collector``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from outbox.relay.runtime import YOUNG_COLLECTION_THRESHOLD, tune_garbage_collector


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    kept = gc.get_threshold()
    yield
    gc.set_threshold(*kept)


def test_the_youngest_generation_is_collected_less_often_and_the_others_as_before() -> None:
    gc.set_threshold(700, 10, 10)  # the interpreter's defaults
    tune_garbage_collector()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, 10, 10)


def test_a_higher_threshold_the_application_chose_is_kept() -> None:
    gc.set_threshold(200_000, 20, 5)
    tune_garbage_collector()
    assert gc.get_threshold() == (200_000, 20, 5)


def test_collection_switched_off_by_a_zero_threshold_stays_off() -> None:
    gc.set_threshold(0, 10, 10)
    tune_garbage_collector()
    assert gc.get_threshold() == (0, 10, 10)
