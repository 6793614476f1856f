"""The telemetry's pure parts: a stored trace context read back safely, and the switch's rules."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace

from outbox import telemetry

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_stored_context_is_passed_on_as_it_was_stored() -> None:
    headers: dict[str, str] = {}
    stored = json.dumps({"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"})
    telemetry.propagate(headers, stored)
    assert headers == {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        json.dumps({"traceparent": "garbage"}),
        json.dumps({"traceparent": TRACEPARENT + "\r\nX-Injected: 1"}),
        json.dumps({"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}),
        json.dumps({"traceparent": 42}),
    ],
)
def test_a_context_edited_by_hand_into_garbage_sends_no_header(stored: str | None) -> None:
    headers: dict[str, str] = {}
    telemetry.propagate(headers, stored)
    assert headers == {}
    assert telemetry.restore(stored) is None


def test_nothing_is_captured_without_an_active_span() -> None:
    assert telemetry.capture() is None


def test_the_switch_does_nothing_unless_asked_and_never_when_disabled() -> None:
    assert telemetry.configure({}) is None
    asked_but_disabled = {
        "OTEL_SDK_DISABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=0",
    }
    assert telemetry.configure(asked_but_disabled) is None
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_a_receivers_address_never_carries_its_path_query_or_credentials() -> None:
    assert telemetry._server("https://user:pw@hooks.example.com/t/s3cret?k=v") == (
        "hooks.example.com",
        443,
    )
    assert telemetry._server("http://127.0.0.1:8080/x") == ("127.0.0.1", 8080)
