"""OpenTelemetry with the real SDK (in-memory exporters): the producer's trace context is kept with
the row and continued by the delivery, one span per attempt, a span per run, the metrics, and no
secret anywhere (real PostgreSQL, real receivers on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry.trace import SpanKind, StatusCode

import outbox
from outbox import operations
from outbox.core.telemetry import Telemetry
from outbox.relay.runtime import Relay
from tests.conftest import SECRET
from tests.support.outbox_helpers import row, seed
from tests.support.receiver import Receiver, Reply
from tests.support.telemetry import Sdk

ORDER = {"orderId": 42}


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    started = Sdk.start()
    yield started
    started.shutdown()


def traceparent_ids(header: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C ``traceparent``."""
    version, trace_id, span_id, flags = header.split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2)
    return trace_id, span_id


def hex_ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


async def enqueue_in_span(sdk: Sdk, db: Any, event_type: str = "OrderCompleted") -> Any:
    """Enqueue one message inside a producer span; returns (message id, producer span)."""
    tracer = sdk.tracer_provider.get_tracer("shop")
    with tracer.start_as_current_span("POST /orders") as producer:
        async with db.transaction():
            message_id = await outbox.enqueue(db, event_type, ORDER)
    return message_id, producer


async def drain(settings: Any, telemetry: Telemetry, trigger: str = "test") -> Any:
    async with await Relay.open(settings, telemetry=telemetry) as relay:
        return await relay.drain(trigger=trigger)


async def test_the_producers_trace_reaches_the_receiver_through_the_delivery_span(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    message_id, producer = await enqueue_in_span(sdk, db)
    stored = json.loads((await row(db, message_id))["trace_context"])
    producer_trace, producer_span = hex_ids(producer)
    assert traceparent_ids(stored["traceparent"]) == (producer_trace, producer_span)

    summary = await drain(make_settings(), sdk.telemetry(), trigger="queue")
    assert summary.processed == 1

    [request] = receiver.requests
    [delivery] = sdk.spans("deliver OrderCompleted")
    [run] = sdk.spans("outbox run")
    # The receiver's traceparent continues the producer's trace, as a child of the delivery span.
    assert traceparent_ids(request.headers["traceparent"]) == hex_ids(delivery)
    assert hex_ids(delivery)[0] == producer_trace
    assert delivery.parent is not None
    assert format(delivery.parent.span_id, "016x") == producer_span
    assert delivery.kind is SpanKind.CLIENT
    assert [link.context.span_id for link in delivery.links] == [run.context.span_id]
    assert dict(delivery.attributes or {}) == {
        "messaging.system": "outbox",
        "messaging.operation.name": "deliver",
        "messaging.operation.type": "send",
        "messaging.destination.name": "OrderCompleted",
        "messaging.message.id": str(message_id),
        "outbox.event_type": "OrderCompleted",
        "outbox.endpoint": "OrderCompleted",
        "outbox.attempt": 1,
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": receiver.port,
        "http.response.status_code": 200,
        "outbox.outcome": "Processed",
    }
    assert delivery.status.status_code is StatusCode.UNSET
    assert dict(run.attributes or {}) == {
        "outbox.trigger": "queue",
        "outbox.leased": 1,
        "outbox.processed": 1,
        "outbox.retried": 0,
        "outbox.failed": 0,
        "outbox.released": 0,
    }


async def test_retries_are_one_span_per_attempt_in_the_producers_trace(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    receiver.script("/orders", Reply(503, b"busy"))
    message_id, producer = await enqueue_in_span(sdk, db)
    telemetry = sdk.telemetry()
    assert (await drain(make_settings(), telemetry)).retried == 1
    await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
    assert (await drain(make_settings(), telemetry)).processed == 1

    spans = sdk.spans("deliver OrderCompleted")
    assert [s.attributes["outbox.attempt"] for s in spans] == [1, 2]  # type: ignore[index]
    assert [s.attributes["outbox.outcome"] for s in spans] == ["Pending", "Processed"]  # type: ignore[index]
    assert [s.attributes["http.response.status_code"] for s in spans] == [503, 200]  # type: ignore[index]
    assert {hex_ids(s)[0] for s in spans} == {hex_ids(producer)[0]}
    assert spans[0].status.status_code is StatusCode.ERROR
    assert spans[0].attributes["error.type"] == "503"  # type: ignore[index]
    # Each attempt told the receiver its own span.
    sent = [traceparent_ids(r.headers["traceparent"]) for r in receiver.requests]
    assert sent == [hex_ids(s) for s in spans]
    assert len(sdk.spans("outbox run")) == 2
    assert (await row(db, message_id))["status"] == "Processed"


async def test_the_metrics_and_their_attributes_after_a_drain_with_each_outcome(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    receiver.script("/retry", then=Reply(503))
    receiver.script("/gone", then=Reply(410))
    webhooks = {
        "Delivered": {"url": receiver.url("/ok"), "secret": SECRET},
        "Retried": {"url": receiver.url("/retry")},
        "Gone": {"url": receiver.url("/gone")},
    }
    for event_type in webhooks:
        await seed(db, event_type=event_type)
    summary = await drain(make_settings(webhooks=webhooks), sdk.telemetry())
    assert (summary.processed, summary.retried, summary.failed) == (1, 1, 1)

    counted = {
        tuple(sorted(p.attributes.items())): p.value for p in sdk.points("outbox.deliveries")
    }
    assert counted == {
        (("endpoint", "Delivered"), ("event_type", "Delivered"), ("outcome", "Processed")): 1,
        (("endpoint", "Retried"), ("event_type", "Retried"), ("outcome", "Pending")): 1,
        (("endpoint", "Gone"), ("event_type", "Gone"), ("outcome", "Failed")): 1,
    }
    durations = sdk.points("outbox.delivery.duration")
    assert sorted(p.attributes["outcome"] for p in durations) == ["Failed", "Pending", "Processed"]
    assert all(p.count == 1 and p.sum > 0 for p in durations)
    [lag] = sdk.points("outbox.delivery.lag")  # only a 2xx has a lag
    assert dict(lag.attributes) == {"event_type": "Delivered", "endpoint": "Delivered"}
    assert lag.count == 1
    assert 0 <= lag.sum < 60


async def test_status_calls_feed_the_backlog_gauges(db: Any, sdk: Sdk) -> None:
    telemetry = sdk.telemetry()
    await seed(db)
    await seed(db)
    await db.execute(
        "UPDATE outbox_messages SET created_at = now() - interval '90 seconds' "
        "WHERE outbox_message_id = (SELECT min(outbox_message_id::text)::uuid FROM outbox_messages)"
    )
    assert sdk.points("outbox.backlog.messages") == []  # nothing seen yet: nothing reported
    await operations.backlog_status(db, 300, telemetry=telemetry)
    counts = {p.attributes["status"]: p.value for p in sdk.points("outbox.backlog.messages")}
    assert counts == {"Pending": 2, "Processing": 0, "Processed": 0, "Failed": 0}
    [oldest] = sdk.points("outbox.backlog.oldest_unpublished_age")
    assert 85 <= oldest.value < 200
    [breakers] = sdk.points("outbox.breakers.open")
    assert breakers.value == 0


async def test_without_an_active_span_nothing_is_stored_and_the_run_starts_the_trace(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    async with db.transaction():
        message_id = await outbox.enqueue(db, "OrderCompleted", ORDER)
    assert (await row(db, message_id))["trace_context"] is None
    assert (await drain(make_settings(), sdk.telemetry())).processed == 1
    [delivery] = sdk.spans("deliver OrderCompleted")
    [run] = sdk.spans("outbox run")
    assert delivery.parent is not None
    assert delivery.parent.span_id == run.context.span_id  # in the run's trace instead
    assert delivery.links == ()
    [request] = receiver.requests
    assert traceparent_ids(request.headers["traceparent"]) == hex_ids(delivery)


async def test_without_an_sdk_the_relay_works_and_passes_the_producers_context_on(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    """The process's global providers are the API's no-ops here: nothing is recorded, the
    webhook carries the producer's context (its span as the parent) where one was stored, and
    no traceparent where none was."""
    message_id, producer = await enqueue_in_span(sdk, db)
    [untraced] = await seed(db)
    async with await Relay.open(make_settings()) as relay:  # the global (no-op) telemetry
        summary = await relay.drain()
    assert summary.processed == 2
    sent = {r.webhook_id: r.headers.get("traceparent") for r in receiver.requests}
    assert sent[str(untraced)] is None
    assert traceparent_ids(sent[str(message_id)] or "") == hex_ids(producer)
    assert sdk.spans("deliver OrderCompleted") == []
    assert (await row(db, message_id))["status"] == "Processed"


async def test_the_sync_producer_keeps_the_trace_context_too(
    db: Any, database_url: str, sdk: Sdk
) -> None:
    tracer = sdk.tracer_provider.get_tracer("shop")
    with psycopg.connect(database_url) as conn, tracer.start_as_current_span("job") as producer:
        message_id = outbox.sync.enqueue(conn, "OrderCompleted", ORDER)
    stored = json.loads((await row(db, message_id))["trace_context"])
    assert traceparent_ids(stored["traceparent"]) == hex_ids(producer)


async def test_log_records_carry_the_delivery_spans_ids(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk, caplog: pytest.LogCaptureFixture
) -> None:
    await enqueue_in_span(sdk, db)
    with caplog.at_level(logging.DEBUG, logger="outbox.delivery"):
        await drain(make_settings(), sdk.telemetry())
    [delivery] = sdk.spans("deliver OrderCompleted")
    [record] = [r for r in caplog.records if r.name == "outbox.delivery"]
    trace_id, span_id = hex_ids(delivery)
    assert (record.outbox_trace_id, record.outbox_span_id) == (trace_id, span_id)  # type: ignore[attr-defined]
    assert f"trace_id={trace_id}" in record.getMessage()


async def test_no_secret_in_any_attribute_link_or_stored_context(
    db: Any, receiver: Receiver, make_settings: Any, sdk: Sdk
) -> None:
    token, header_value = "tok3n-in-path", "Bearer h3ader-s3cret"
    receiver.script(f"/hook/{token}", Reply(500, f"echo {header_value} {SECRET}".encode()))
    webhooks = {
        "OrderCompleted": {
            "url": receiver.url(f"/hook/{token}?key=qu3ry-s3cret"),
            "secret": SECRET,
            "headers": {"Authorization": header_value},
        }
    }
    message_id, _ = await enqueue_in_span(sdk, db)
    assert (await drain(make_settings(webhooks=webhooks), sdk.telemetry())).retried == 1
    assert receiver.requests[0].headers["authorization"] == header_value  # it was sent
    values = list(sdk.all_attribute_values())
    assert values
    for secret in (token, "qu3ry-s3cret", header_value, "h3ader-s3cret", SECRET, "echo"):
        assert not [v for v in values if secret in v], secret
    stored = (await row(db, message_id))["trace_context"]
    assert all(secret not in stored for secret in (token, header_value, SECRET))
