"""``outbox serve``'s ``/metrics`` as Prometheus reads them: the delivery histograms have
boundaries in seconds, so a quantile computed from them lands in the small bucket of what was
measured, not in OpenTelemetry's default first bucket (0 to 5, shaped for milliseconds)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import outbox
from outbox.core.telemetry import DURATION_BUCKETS_SECONDS, LAG_BUCKETS_SECONDS
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import eventually, statuses
from tests.support.processes import Child
from tests.support.receiver import Receiver, Reply

KEY = "serve-metrics-function-key-01234"
MESSAGES = 10
# The receiver answers each request after this: every delivery takes at least as long.
RECEIVER_DELAY_SECONDS = 0.05
# Bounds for waits on a busy machine, never timed.
SLACK_SECONDS = 30

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last


def buckets(metrics: str, name: str) -> Buckets:
    """The cumulative buckets of histogram ``name``, summed over its series."""
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
    return sorted(counts.items())


def quantile(q: float, cumulative: Buckets) -> tuple[float, tuple[float, float]]:
    """Prometheus' ``histogram_quantile``: the q-quantile by linear interpolation within the
    bucket it falls in; and that bucket's (lower, upper) bounds."""
    total = cumulative[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank:
            if math.isinf(upper):
                return lower, (lower, upper)
            return lower + (upper - lower) * (rank - below) / (count - below), (lower, upper)
        lower, below = upper, count
    raise AssertionError(f"no bucket holds rank {rank}")


def bounds(cumulative: Iterable[tuple[float, float]]) -> tuple[float, ...]:
    return tuple(upper for upper, _ in cumulative if not math.isinf(upper))


@pytest.fixture
def serve_env(database_url: str, receiver: Receiver, tmp_path: Path) -> dict[str, str]:
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WAKEUP": "postgres",
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
        "OUTBOX_FUNCTION_KEY": KEY,
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


async def test_delivery_quantiles_from_metrics_fall_in_small_buckets_in_seconds(
    db: Any,
    receiver: Receiver,
    serve_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")  # the producer below wakes serve at once
    receiver.script("/orders", then=Reply(204, delay=RECEIVER_DELAY_SECONDS))
    port = free_port()
    app = "tests.support.sweepless_app:app"
    child = await Child.start("outbox", "serve", "--port", str(port), "--app", app, env=serve_env)
    try:
        await child.wait_for_line(r"outbox\.drain trigger=startup")
        for order in range(MESSAGES):  # one at a time: each one's lag is its own
            async with outbox.transaction(db) as tx:
                await tx.enqueue("OrderCompleted", {"orderId": order})
            await receiver.wait_for(order + 1, timeout=SLACK_SECONDS)

        async def all_processed() -> bool:
            return await statuses(db) == {"Processed": MESSAGES}

        await eventually(all_processed, timeout=SLACK_SECONDS)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics", headers={"x-functions-key": KEY}) as r,
        ):
            assert r.status == 200
            metrics = await r.text()
    finally:
        await child.kill()

    duration = buckets(metrics, "outbox_delivery_duration_seconds")
    lag = buckets(metrics, "outbox_delivery_lag_seconds")
    assert bounds(duration) == DURATION_BUCKETS_SECONDS
    assert bounds(lag) == LAG_BUCKETS_SECONDS
    assert duration[-1][1] == lag[-1][1] == MESSAGES
    for name, cumulative in (("duration", duration), ("lag", lag)):
        for q in (0.5, 0.99):
            value, (lower, upper) = quantile(q, cumulative)
            print(f"{name} p{q * 100:g}: {value:.4f} s, in the bucket ({lower:g}, {upper:g}]")
            # Each delivery took the receiver's delay at least; on this machine, far below 1 s.
            # With OpenTelemetry's default boundaries all of them share the bucket (0, 5]:
            # every quantile would read 2.5 s or more.
            assert RECEIVER_DELAY_SECONDS <= value <= 1.0, (name, q, value)
            assert lower < value <= upper <= 1.0
            assert upper >= RECEIVER_DELAY_SECONDS
