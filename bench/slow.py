"""Latency-bound delivery: one relay process against receivers that take 100 ms to answer.

Each round drains the same backlog three times, in an order drawn at random per round: to the
instant receiver, to one that answers every request after 100 ms (``/slow/100``), and to one
whose answer times are lognormal around a 100 ms median (``/lognormal/100``). The relay runs
with its default ``OUTBOX_CONCURRENCY`` and batch size, as a process of its own
(``bench.worker relay``, ``Relay.open`` then ``execute()``). Judged per round: the slow
receivers' rate ÷ the instant receiver's rate in the same round; reported as the median of the
per-round ratios with their spread, beside the rates and each run's peak RSS.
"""

from __future__ import annotations

import random
from typing import Any

from bench.common import ReceiverProcess, log, median
from bench.throughput import Options, run_one
from outbox.core.settings import Settings

RECEIVERS = {"instant": "/hook", "slow_100ms": "/slow/100", "lognormal_100ms": "/lognormal/100"}


def default_concurrency() -> int:
    """The relay's default ``OUTBOX_CONCURRENCY``."""
    default = Settings.model_fields["concurrency"].default
    assert isinstance(default, int)
    return default


async def measure(
    receiver: ReceiverProcess, *, messages: int, runs: int, seed: int | None = None
) -> dict[str, Any]:
    concurrency = default_concurrency()
    order = random.Random(seed)
    rounds: list[dict[str, dict[str, float]]] = []
    for round_ in range(1, runs + 1):
        names = list(RECEIVERS)
        order.shuffle(names)
        results: dict[str, dict[str, float]] = {}
        for name in names:
            options = Options(messages=messages, concurrency=concurrency, path=RECEIVERS[name])
            run = await run_one("relay", round_, receiver, options)
            results[name] = {"rate": run.rate, "peak_rss_mb": run.peak_rss_mb}
        log(f"slow receivers round {round_} ({', '.join(names)}): {results}")
        rounds.append(results)
    return summarise(rounds, concurrency, messages)


def summarise(
    rounds: list[dict[str, dict[str, float]]], concurrency: int, messages: int
) -> dict[str, Any]:
    ratios = {
        name: [r[name]["rate"] / r["instant"]["rate"] for r in rounds]
        for name in RECEIVERS
        if name != "instant"
    }
    return {
        "concurrency": concurrency,
        "messages": messages,
        "rounds": rounds,
        "median_rate": {n: median([r[n]["rate"] for r in rounds]) for n in RECEIVERS},
        "peak_rss_mb_max": max(r[n]["peak_rss_mb"] for r in rounds for n in RECEIVERS),
        "ratio_to_instant": {
            name: {"median": round(median(values), 3), "low": min(values), "high": max(values)}
            for name, values in ratios.items()
        },
    }
