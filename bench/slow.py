"""Latency-bound delivery: one relay process against receivers that take 100 ms to answer.

Each round drains the same backlog three times, in an order drawn at random per round: to the
instant receiver, to one that answers every request after 100 ms (``/slow/100``), and to one
whose answer times are lognormal around a 100 ms median (``/lognormal/100``). The relay runs
with its default ``OUTBOX_CONCURRENCY`` (or ``--slow-concurrency``) and batch size, as a
process of its own (``bench.worker relay``, ``Relay.open`` then ``execute()``).

Two rates per drain: the drain's (messages ÷ first lease to last outcome) and its steady rate
(the middle 80 % of its outcomes, ``bench.common.outbox_steady_rate``). A fresh process's drain
against a slow receiver starts with its endpoint's limit of requests in flight growing from 16
(doubling per round trip: about 0.6 s at 100 ms) and ends with its last batches waiting for their
slowest answers (a lognormal receiver's slowest of 40,000 takes about seven times the median);
neither recurs while a running process delivers. Judged per round: the slow receivers' steady
rate ÷ the instant receiver's in the same round, reported as the median of the per-round ratios
with their spread; the drains' ratios are reported beside them, with the rates and each run's
peak RSS.

``lognormal_100ms_learned`` is the lognormal drain by a fresh process whose database holds what a
process before it learned of the endpoint (``outbox_endpoint_limits``, ``relay/learned.py``): in
the same database, a relay process drains ``TEACH_MESSAGES`` to the same receiver and exits (its
limits are kept as it closes); its messages are truncated, then the backlog is enqueued and the
measured process starts, as a new instance of a scaled-out or restarted app would.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import replace
from typing import Any

from bench.common import (
    SECRET,
    Database,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    relay_settings,
    settle,
)
from bench.throughput import BeforeEnqueue, Options, run_one, run_worker
from outbox.core.settings import default_concurrency
from outbox.relay.runtime import Relay

RECEIVERS = {
    "instant": "/hook",
    "slow_100ms": "/slow/100",
    "lognormal_100ms": "/lognormal/100",
    "lognormal_100ms_learned": "/lognormal/100",
}
# Drained by a fresh process after one before it learned the endpoint's limit.
LEARNED = {"lognormal_100ms_learned"}
# What that process before it drains (its limit doubles from 16 to 1,024 within about 2,000).
TEACH_MESSAGES = 5_000


async def measure(
    receiver: ReceiverProcess,
    *,
    messages: int,
    runs: int,
    seed: int | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """``concurrency``: the relay's ``OUTBOX_CONCURRENCY`` (None: its default)."""
    concurrency = concurrency or default_concurrency()
    order = random.Random(seed)
    rounds: list[dict[str, dict[str, float]]] = []
    for round_ in range(1, runs + 1):
        names = list(RECEIVERS)
        order.shuffle(names)
        results: dict[str, dict[str, float]] = {}
        for name in names:
            options = Options(messages=messages, concurrency=concurrency, path=RECEIVERS[name])
            before = taught(receiver, options) if name in LEARNED else None
            run = await run_one("relay", round_, receiver, options, before)
            results[name] = {
                "rate": run.rate,
                # Where the middle 80 % is a single outcome write (a tiny smoke run): the drain's.
                "steady_rate": run.steady_rate or run.rate,
                "peak_rss_mb": run.peak_rss_mb,
                "worker_cpu_us_per_message": round(run.cpu_seconds["worker"] / messages * 1e6, 1),
            }
        log(f"slow receivers round {round_} ({', '.join(names)}): {results}")
        rounds.append(results)
    return summarise(rounds, concurrency, messages)


def taught(receiver: ReceiverProcess, options: Options) -> BeforeEnqueue:
    """A relay process drains ``TEACH_MESSAGES`` (at most the run's own) to the run's receiver in
    the run's database and exits; then its messages and the receiver's counts are cleared."""

    async def teach(db: Database) -> None:
        count = min(TEACH_MESSAGES, options.messages)
        conn = await db.connect()
        try:
            await enqueue_outbox(conn, count)
            await settle(conn)
            url = receiver.url(options.path)
            run_worker("relay", url, db.url, replace(options, messages=count))
            await conn.execute("TRUNCATE outbox_messages")  # its history too (0011)
            learned = await conn.fetchval("SELECT max(concurrency) FROM outbox_endpoint_limits")
        finally:
            await conn.close()
        await receiver.reset()
        log(f"slow receivers: the process before learned a limit of {learned:.0f}")

    return teach


def summarise(
    rounds: list[dict[str, dict[str, float]]], concurrency: int, messages: int
) -> dict[str, Any]:
    def ratios(rate: str) -> dict[str, dict[str, float]]:
        found = {
            name: [r[name][rate] / r["instant"][rate] for r in rounds]
            for name in RECEIVERS
            if name != "instant"
        }
        return {
            name: {"median": round(median(values), 3), "low": min(values), "high": max(values)}
            for name, values in found.items()
        }

    return {
        "concurrency": concurrency,
        "messages": messages,
        "rounds": rounds,
        "median_rate": {n: median([r[n]["rate"] for r in rounds]) for n in RECEIVERS},
        "median_steady_rate": {n: median([r[n]["steady_rate"] for r in rounds]) for n in RECEIVERS},
        "peak_rss_mb_max": max(r[n]["peak_rss_mb"] for r in rounds for n in RECEIVERS),
        # The relay process's CPU per message: what more requests in flight cost it.
        "worker_cpu_us_per_message": {
            n: median([r[n]["worker_cpu_us_per_message"] for r in rounds]) for n in RECEIVERS
        },
        # Judged: steady rate ÷ the instant receiver's steady rate, per round.
        "ratio_to_instant": ratios("steady_rate"),
        # Reported: the whole drain's rate ÷ the instant receiver's, per round.
        "drain_ratio_to_instant": ratios("rate"),
    }


# The push-back figure: a receiver that takes ``PUSHBACK_LIMIT`` requests at once (100 ms each)
# and answers 429 with Retry-After to any more, beside one that takes every request in 100 ms.
PUSHBACK_LIMIT = 20
LIMITED, STEADY = "Limited", "Steady"
PUSHBACK_GIVE_UP_SECONDS = 600.0


async def measure_pushback(
    receiver: ReceiverProcess, *, messages: int, runs: int
) -> dict[str, Any]:
    """Per round: the steady endpoint's drain alone, then beside the limited one. Reported: the
    limited receiver's 429s per request it took, the most it had at once, the rate it took
    requests at against what it can take (``PUSHBACK_LIMIT`` ÷ 100 ms), and the steady
    endpoint's time beside it ÷ alone."""
    rounds = []
    for round_ in range(1, runs + 1):
        alone = await _pushback_run(receiver, messages, with_limited=False)
        beside = await _pushback_run(receiver, messages, with_limited=True)
        result = {
            "steady_alone_seconds": alone["steady_seconds"],
            "steady_beside_seconds": beside["steady_seconds"],
            "steady_beside_vs_alone": round(beside["steady_seconds"] / alone["steady_seconds"], 3),
            **{k: v for k, v in beside.items() if k != "steady_seconds"},
        }
        log(f"push-back round {round_}: {result}")
        rounds.append(result)
    return {
        "limit_in_flight": PUSHBACK_LIMIT,
        "capacity_per_second": PUSHBACK_LIMIT / 0.1,
        "messages": messages,
        "rounds": rounds,
        "refused_per_accepted_median": median([r["refused_per_accepted"] for r in rounds]),
        "steady_beside_vs_alone_median": median([r["steady_beside_vs_alone"] for r in rounds]),
    }


async def _pushback_run(
    receiver: ReceiverProcess, messages: int, *, with_limited: bool
) -> dict[str, Any]:
    await receiver.reset()
    async with Database("pushback") as db:
        await db.migrate()
        conn = await db.connect()
        try:
            await enqueue_outbox(conn, messages, event_type=STEADY)
            if with_limited:
                await enqueue_outbox(conn, messages, event_type=LIMITED)
            await settle(conn)
            webhooks = {
                STEADY: {"url": receiver.url("/slow/100"), "secret": SECRET},
                LIMITED: {"url": receiver.url(f"/limited/{PUSHBACK_LIMIT}"), "secret": SECRET},
            }
            settings = relay_settings(
                db.url, receiver.url(), default_concurrency(), webhooks=webhooks
            )
            logging.getLogger("outbox").setLevel(logging.ERROR)  # not a warning per 429
            steady_seconds = 0.0
            started = time.monotonic()
            async with await Relay.open(settings) as relay:
                while True:
                    await relay.processor.execute()
                    counts = await _counts(conn)
                    if not steady_seconds and counts.get(STEADY) == messages:
                        steady_seconds = time.monotonic() - started
                    if sum(counts.values()) == messages * (2 if with_limited else 1):
                        break
                    if time.monotonic() - started > PUSHBACK_GIVE_UP_SECONDS:
                        raise AssertionError(f"push-back run incomplete: {counts}")
                    await asyncio.sleep(0.2)  # what waits is the limited one's Retry-After
            took = time.monotonic() - started
        finally:
            await conn.close()
    stats = await receiver.stats()
    accepted = stats.requests - messages  # the steady receiver took one per message
    return {
        "steady_seconds": round(steady_seconds, 3),
        "limited_accepted": accepted,
        "limited_refused": stats.refused,
        "refused_per_accepted": round(stats.refused / max(accepted, 1), 3),
        "limited_max_in_flight": stats.max_in_flight,
        "limited_accepted_per_second": round(accepted / took, 1),
    }


async def _counts(conn: Any) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT event_type, count(*) AS n FROM outbox_messages WHERE status = 'Processed' "
        "GROUP BY event_type"
    )
    return {r["event_type"]: r["n"] for r in rows}
