"""Exporter cost: the relay with the OpenTelemetry SDK and the OTLP exporter on, against no SDK.

Per round, in an order drawn at random, the same backlog is drained by one relay process
(``bench.worker relay``) to the instant receiver three ways:

- ``no_sdk``: no SDK configured, as the relay ships (the API's no-ops);
- ``otlp``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, so the worker sets up the SDK as the hosts
  do before they open a relay (``outbox.telemetry.configure()``): a ``BatchSpanProcessor`` and a
  ``PeriodicExportingMetricReader``, both exporting OTLP/HTTP protobuf, with their defaults;
  every delivery's span is sampled;
- ``otlp_sampled``: the same, with one message in ``SAMPLED_ONE_IN`` carrying a sampled
  producer context, as a producer sampling with ``ParentBased(TraceIdRatioBased(0.1))`` leaves
  them: the relay's default sampler (``parentbased_always_on``) follows the producer's choice;
- ``otlp_unsampled``: no message's context sampled: what the metrics (and the spans that are
  started but not recorded) cost alone.

Every message carries a producer's W3C context (``trace_context``), as it does when producers
trace: a delivery span is the child of it. The "collector" is a small HTTP server in this
process (a thread of its own) that answers 200 to OTLP/HTTP POSTs on ``/v1/traces`` and
``/v1/metrics``, and counts requests and the spans they hold. The worker flushes the SDK before
it exits, so its CPU includes the export of every span it recorded.

Judged per round: ``otlp``'s rate ÷ ``no_sdk``'s, and its CPU per message ÷ ``no_sdk``'s;
reported as the median of the per-round ratios with their spread.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.common import (
    ROOT,
    Database,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    outbox_counts,
    outbox_wall_seconds,
    settle,
)
from bench.dbcost import worker_command

VARIANTS = ("no_sdk", "otlp", "otlp_sampled", "otlp_unsampled")
SAMPLED_ONE_IN = 10
# The share of messages whose producer context is sampled, per variant.
SAMPLED = {"no_sdk": 1.0, "otlp": 1.0, "otlp_sampled": 1 / SAMPLED_ONE_IN, "otlp_unsampled": 0.0}

# Each message gets a producer's context: a random trace and span id, sampled where $1 says.
PRODUCER_CONTEXT = """
UPDATE outbox_messages
SET trace_context = jsonb_build_object(
    'traceparent',
    '00-' || md5(outbox_message_id::text) || '-' || substr(md5(random()::text), 1, 16) || '-'
    || CASE WHEN random() < $1 THEN '01' ELSE '00' END)
"""


class Collector:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers 200 and counts what it was sent."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.spans = 0
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("content-length") or 0))
                collector.received(self.path, data)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def received(self, path: str, data: bytes) -> None:
        spans = _span_count(data) if path == "/v1/traces" else 0
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1
            self.spans += spans

    def reset(self) -> None:
        with self._lock:
            self.requests, self.spans = {}, 0


def _span_count(data: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest.FromString(data)
    return sum(
        len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans
    )


def environment(variant: str, collector: Collector) -> dict[str, str]:
    """The worker's environment: none of the parent's OTEL_* settings, the collector's where
    the variant exports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("APPLICATIONINSIGHTS_CONNECTION_STRING", None)
    if variant != "no_sdk":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
    return env


def run_worker(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"relay worker failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def drain(
    receiver: ReceiverProcess,
    collector: Collector,
    variant: str,
    messages: int,
    concurrency: int,
) -> dict[str, Any]:
    await receiver.reset()
    collector.reset()
    sampled = SAMPLED[variant]
    async with Database("exporter") as db:
        conn = await db.connect()
        try:
            await db.migrate()
            await enqueue_outbox(conn, messages)
            await conn.execute(PRODUCER_CONTEXT, sampled)
            await settle(conn)
            command = worker_command(
                db, receiver.url("/hook"), concurrency, "--messages", str(messages), "--flush"
            )
            output = await asyncio.to_thread(run_worker, command, environment(variant, collector))
            counts = await outbox_counts(conn)
            wall = await outbox_wall_seconds(conn)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if counts != {"Processed": messages} or stats.distinct != messages:
        raise AssertionError(f"{variant}: drain incomplete: {counts}, {stats.distinct} ids")
    if variant != "no_sdk" and not collector.requests:
        raise AssertionError(f"{variant}: the collector was sent nothing")
    return {
        "rate": round(messages / wall, 1),
        "relay_cpu_us_per_message": round(output["cpu_seconds"] / messages * 1e6, 1),
        "peak_rss_mb": output["peak_rss_mb"],
        "spans_exported": collector.spans,
        "otlp_requests": dict(collector.requests),
    }


async def measure(
    receiver: ReceiverProcess,
    *,
    messages: int,
    runs: int,
    concurrency: int,
    seed: int | None = None,
) -> dict[str, Any]:
    order = random.Random(seed)
    rounds: list[dict[str, dict[str, Any]]] = []
    with Collector() as collector:
        for round_ in range(1, runs + 1):
            names = list(VARIANTS)
            order.shuffle(names)
            results = {
                name: await drain(receiver, collector, name, messages, concurrency)
                for name in names
            }
            log(f"exporter round {round_} ({', '.join(names)}): {results}")
            rounds.append(results)
    return summarise(rounds, messages)


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(median(values), digits),
        "low": round(min(values), digits),
        "high": round(max(values), digits),
    }


def summarise(rounds: list[dict[str, dict[str, Any]]], messages: int) -> dict[str, Any]:
    exported = [v for v in VARIANTS if v != "no_sdk"]
    return {
        "messages": messages,
        "sampled_one_in": SAMPLED_ONE_IN,
        "rounds": rounds,
        "median": {
            name: {
                key: _spread([r[name][key] for r in rounds], 1)
                for key in ("rate", "relay_cpu_us_per_message", "peak_rss_mb")
            }
            for name in VARIANTS
        },
        # Per round: the variant's rate, and its CPU per message, ÷ no SDK's in the same round.
        "rate_vs_no_sdk": {
            name: _spread([r[name]["rate"] / r["no_sdk"]["rate"] for r in rounds])
            for name in exported
        },
        "cpu_vs_no_sdk": {
            name: _spread(
                [
                    r[name]["relay_cpu_us_per_message"] / r["no_sdk"]["relay_cpu_us_per_message"]
                    for r in rounds
                ]
            )
            for name in exported
        },
    }
