"""The producer's trace crosses processes: a producer here (the real SDK), ``python -m outbox
drain`` in a process of its own exporting with the switch ``outbox.telemetry.configure()`` turns
on (OTLP over HTTP, or Azure Monitor), to a real collector on 127.0.0.1, and a real receiver."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import outbox
from tests.conftest import SECRET
from tests.support.outbox_helpers import run_cli
from tests.support.receiver import Receiver
from tests.support.telemetry import Sdk


class Collector:
    """Records every POST by path: an OTLP/HTTP collector, or Application Insights' ingestion."""

    def __init__(self) -> None:
        self.posts: dict[str, list[bytes]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Collector:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.posts.setdefault(request.path, []).append(body)
        return web.json_response({"itemsReceived": 1, "itemsAccepted": 1, "errors": []})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    started = await Collector().start()
    yield started
    await started.stop()


async def produce(db: Any) -> tuple[str, str]:
    """One message enqueued inside a producer span: its (trace id, span id) in hex."""
    sdk = Sdk.start()
    try:
        with sdk.tracer_provider.get_tracer("shop").start_as_current_span("POST /orders") as span:
            async with db.transaction():
                await outbox.enqueue(db, "OrderCompleted", {"orderId": 42})
        context = span.get_span_context()
        return format(context.trace_id, "032x"), format(context.span_id, "016x")
    finally:
        sdk.shutdown()


def relay_env(database_url: str, receiver: Receiver, **extra: str) -> dict[str, str]:
    webhooks = {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(webhooks),
        **extra,
    }


async def test_otlp_export_carries_the_producers_trace_across_processes(
    db: Any, database_url: str, receiver: Receiver, collector: Collector
) -> None:
    trace_id, producer_span = await produce(db)
    env = relay_env(
        database_url,
        receiver,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
        OTEL_SERVICE_NAME="orders-relay",
    )
    result = await run_cli("drain", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["processed"] == 1

    [request] = receiver.requests
    assert request.headers["traceparent"].split("-")[1] == trace_id

    spans = []
    for body in collector.posts.get("/v1/traces", []):
        exported = ExportTraceServiceRequest.FromString(body)
        for resource in exported.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            assert service["service.name"] == "orders-relay"
            spans += [s for scope in resource.scope_spans for s in scope.spans]
    [delivery] = [s for s in spans if s.name == "deliver OrderCompleted"]
    assert delivery.trace_id.hex() == trace_id
    assert delivery.parent_span_id.hex() == producer_span
    assert request.headers["traceparent"].split("-")[2] == delivery.span_id.hex()
    assert [s.name for s in spans].count("outbox run") == 1

    names = set()
    for body in collector.posts.get("/v1/metrics", []):
        exported_metrics = ExportMetricsServiceRequest.FromString(body)
        names |= {
            m.name
            for resource in exported_metrics.resource_metrics
            for scope in resource.scope_metrics
            for m in scope.metrics
        }
    assert {"outbox.deliveries", "outbox.delivery.duration", "outbox.delivery.lag"} <= names


async def test_otlp_metrics_switched_off_export_the_trace_alone(
    db: Any, database_url: str, receiver: Receiver, collector: Collector
) -> None:
    trace_id, _ = await produce(db)
    env = relay_env(
        database_url,
        receiver,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
        OTEL_METRICS_EXPORTER="none",
    )
    result = await run_cli("drain", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["processed"] == 1
    assert "/v1/metrics" not in collector.posts
    spans = [
        s
        for body in collector.posts["/v1/traces"]
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans
        for scope in resource.scope_spans
        for s in scope.spans
    ]
    assert [s.trace_id.hex() for s in spans if s.name == "deliver OrderCompleted"] == [trace_id]


async def test_azure_monitor_switch_sends_the_delivery_to_application_insights(
    db: Any, database_url: str, receiver: Receiver, collector: Collector
) -> None:
    trace_id, _ = await produce(db)
    connection = (
        "InstrumentationKey=00000000-0000-0000-0000-000000000001;"
        f"IngestionEndpoint=http://127.0.0.1:{collector.port}"
    )
    env = relay_env(
        database_url,
        receiver,
        APPLICATIONINSIGHTS_CONNECTION_STRING=connection,
        APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL="true",
        # Azure Monitor samples at most 5 traces a second by default (a new process: none yet).
        OTEL_TRACES_SAMPLER="microsoft.fixed_percentage",
        OTEL_TRACES_SAMPLER_ARG="1.0",
    )
    result = await run_cli("drain", env=env)
    assert result.returncode == 0, result.stderr
    assert receiver.requests[0].headers["traceparent"].split("-")[1] == trace_id

    items = []
    for body in collector.posts.get("/v2.1/track", []):
        text = body.decode()
        parsed = (
            json.loads(text)
            if text.startswith("[")
            else [json.loads(line) for line in text.splitlines()]
        )
        items += parsed
    dependencies = [i for i in items if i["data"]["baseType"] == "RemoteDependencyData"]
    # Application Insights names an HTTP dependency by its method and path ("POST /": the relay
    # gives no path, which may hold a secret); the span's attributes are its properties.
    [delivery] = [
        d
        for d in dependencies
        if d["data"]["baseData"].get("properties", {}).get("outbox.event_type") == "OrderCompleted"
    ]
    assert delivery["tags"]["ai.operation.id"] == trace_id
    assert delivery["data"]["baseData"]["resultCode"] == "200"
