"""The latency section's arithmetic (bench.latency), the Functions host stand-in's polling
backoff (bench.hosts) and the WAL method's ratios (bench.walcost), on made-up runs."""

from __future__ import annotations

from typing import Any

import pytest

from bench import headline, hosts, latency, report, walcost


def window() -> latency.Window:
    return latency.Window(start=1000.0, end=1040.0)


def timed(rows: list[tuple[str, float, float]]) -> dict[str, list[Any]]:
    return {
        "ids": [r[0] for r in rows],
        "arrived": [r[1] for r in rows],
        "answered": [r[2] for r in rows],
    }


def test_latency_counts_only_messages_committed_in_the_window() -> None:
    commits = {"early": 999.0, "a": 1000.0, "b": 1020.0, "late": 1040.0}
    answers = timed([(i, c + 0.010, c + 0.020) for i, c in commits.items()])
    found = latency.latency_figures(commits, answers, window(), rate=0.05, seconds=40)
    assert found["messages"] == 2
    assert found["p50_ms"] == pytest.approx(20, abs=0.1)
    assert found["request_p50_ms"] == pytest.approx(10, abs=0.1)
    assert found["undelivered"] == 0


def test_a_message_answered_twice_counts_once_from_its_first_answer() -> None:
    commits = {"a": 1000.0}
    answers = timed([("a", 1000.5, 1000.5), ("a", 1002.0, 1002.0)])
    found = latency.latency_figures(commits, answers, window(), rate=0.025, seconds=40)
    assert found["max_ms"] == pytest.approx(500, abs=0.1)
    assert found["duplicates"] == 1


def test_a_request_whose_answer_never_left_is_not_delivered() -> None:
    commits = {"a": 1000.0, "b": 1001.0}
    answers = timed([("a", 1000.1, 1000.1), ("b", 1001.1, 0.0)])
    found = latency.latency_figures(commits, answers, window(), rate=0.05, seconds=40)
    assert found["undelivered"] == 1
    assert not found["sustained"]


def steady(latency_s: float, growth_per_s: float) -> tuple[dict[str, float], dict[str, list[Any]]]:
    """A message every 0.1 s for the window, each answered ``latency_s`` after its commit plus
    ``growth_per_s`` for every second since the window began."""
    commits = {f"m{i}": 1000.0 + i / 10 for i in range(400)}
    rows = []
    for message_id, c in commits.items():
        answered = c + latency_s + growth_per_s * (c - 1000.0)
        rows.append((message_id, answered, answered))
    return commits, timed(rows)


def test_latency_that_holds_is_sustained() -> None:
    commits, answers = steady(0.02, 0.0)
    found = latency.latency_figures(commits, answers, window(), rate=10, seconds=40)
    assert found["sustained"]
    assert found["growth"]["p50_slope_ms_per_s"] == pytest.approx(0, abs=0.5)


def test_latency_that_grows_with_the_backlog_is_not_sustained() -> None:
    # A relay delivering half of what is offered: each second adds half a second of waiting.
    commits, answers = steady(0.02, 0.5)
    found = latency.latency_figures(commits, answers, window(), rate=10, seconds=40)
    assert not found["sustained"]
    assert found["growth"]["p50_slope_ms_per_s"] == pytest.approx(500, rel=0.05)


def test_producers_that_fell_short_of_the_rate_do_not_sustain_it() -> None:
    commits, answers = steady(0.02, 0.0)
    found = latency.latency_figures(commits, answers, window(), rate=20, seconds=40)
    assert found["achieved"] == 10
    assert not found["sustained"]


def run(contender: str, round_: int, p99: float, rate: float = 1000.0) -> dict[str, Any]:
    return {
        "scenario": "steady",
        "contender": contender,
        "delay_ms": 0,
        "rate": rate,
        "round": round_,
        "p99_ms": p99,
    }


def test_p99_against_pgqueuer_is_the_median_of_per_round_ratios() -> None:
    runs = [
        run("pgqueuer", 1, 10.0),
        run("serve_postgres", 1, 20.0),
        run("pgqueuer", 2, 40.0),
        run("serve_postgres", 2, 20.0),
        run("pgqueuer", 3, 20.0),
        run("serve_postgres", 3, 30.0),
    ]
    [ratio] = latency.ratios_to_pgqueuer(runs)
    assert (ratio["p99_vs_pgqueuer"], ratio["low"], ratio["high"]) == (1.5, 0.5, 2.0)


def test_the_goals_read_the_instant_receiver_at_1000_a_second() -> None:
    table = [
        {"scenario": "steady", "contender": "serve_postgres", "delay_ms": 0, "rate": 1000.0,
         "p99_ms": 12.0},
        {"scenario": "steady", "contender": "serve_postgres", "delay_ms": 50, "rate": 1000.0,
         "p99_ms": 70.0},
        {"scenario": "slow", "contender": "serve_postgres", "delay_ms": 200, "rate": 200.0,
         "p99_ms": 230.0, "request_p99_ms": 9.0},
    ]  # fmt: skip
    assert latency.goals(table) == {
        "latency_serve_postgres_p99_ms": 12.0,
        "latency_slow_receiver_request_p99_ms": 9.0,
    }


def test_a_goal_whose_rate_the_producers_fell_short_of_is_not_judged() -> None:
    table = [
        {"scenario": "steady", "contender": "serve_queue", "delay_ms": 0, "rate": 1000.0,
         "achieved": 231.0, "p99_ms": 280.0},
        {"scenario": "steady", "contender": "serve_postgres", "delay_ms": 0, "rate": 1000.0,
         "achieved": 994.0, "p99_ms": 60.0},
    ]  # fmt: skip
    assert latency.goals(table) == {"latency_serve_postgres_p99_ms": 60.0}
    assert latency.goals_not_offered(table) == {"latency_serve_queue_p99_ms": 231.0}


def test_the_host_polls_again_soon_after_a_message_then_backs_off_to_its_maximum() -> None:
    backoff = hosts.Backoff(maximum=1.0)
    assert backoff.next_delay(found=True) == pytest.approx(0.1)
    delays = [backoff.next_delay(found=False) for _ in range(8)]
    # The minimum plus a randomised doubling step (±20 %): 0.2, 0.3, 0.5, 0.9, then the maximum.
    assert 0.18 <= delays[0] <= 0.22
    assert delays == sorted(delays)
    assert delays[-1] == 1.0
    assert backoff.next_delay(found=True) == pytest.approx(0.1)


def wal_run(contender: str, round_: int, whole: float, delivered: float) -> dict[str, Any]:
    return {
        "contender": contender,
        "round": round_,
        "messages": 3000,
        "variant": "flow",
        "payload": "standard",
        "whole_life_bytes_per_msg": whole,
        "delivered_bytes_per_msg": delivered,
        "enqueued_bytes_per_msg": whole - delivered,
    }


def test_the_wal_ratios_pair_the_contenders_of_each_round() -> None:
    runs = [
        wal_run("relay", 1, 2000, 1100),
        wal_run("pgqueuer", 1, 3000, 1500),
        wal_run("relay", 2, 1900, 1000),
        wal_run("pgqueuer", 2, 3100, 1600),
    ]
    [row] = walcost.ratios(runs)
    whole = row["whole_life_relay_vs_pgqueuer"]
    assert (whole["low"], whole["high"]) == (0.613, 0.667)
    assert row["whole_life_bytes"] == {"relay": 1950, "pgqueuer": 3050}


def test_the_headline_reports_a_goal_not_offered_as_not_judged() -> None:
    row = {"scenario": "steady", "contender": "serve_queue", "delay_ms": 0, "rate": 1000.0}
    table = [{**row, "achieved": 231.0, "p99_ms": 280.0}]
    doc = {
        "date": "2026-12-07T12:00:00+00:00",
        "machine": {"cores": 2, "cpu": "test"},
        "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]},
        "latency": {"table": table, "vs_pgqueuer": [], "goals_not_offered": {}},
    }
    doc["latency"]["goals_not_offered"] = latency.goals_not_offered(table)
    doc["targets"] = report.targets({"latency": {"goals": latency.goals(table)}})
    found = headline.table(doc)
    assert "not judged: the producers offered 231 msg/s" in found
    assert "(met)" not in found
