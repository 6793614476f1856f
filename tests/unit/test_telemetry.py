"""The telemetry's pure parts: a stored trace context read back safely, and the switch's rules."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
from opentelemetry import trace

from outbox import telemetry as public
from outbox.azure import telemetry_setup
from outbox.core import telemetry
from outbox.core.settings import Settings
from outbox.relay.runtime import Relay
from outbox.store import QUERIES

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
    assert telemetry_setup.configure({}) is None
    asked_but_disabled = {
        "OTEL_SDK_DISABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=0",
    }
    assert telemetry_setup.configure(asked_but_disabled) is None
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_a_receivers_address_never_carries_its_path_query_or_credentials() -> None:
    assert telemetry._server("https://user:pw@hooks.example.com/t/s3cret?k=v") == (
        "hooks.example.com",
        443,
    )
    assert telemetry._server("http://127.0.0.1:8080/x") == ("127.0.0.1", 8080)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "outbox.telemetry"]


def _unique_tracestate() -> str:
    # Each test its own value: a value already seen in this process is not warned about again.
    return f"vendor={uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "carrier",
    [
        # Deep enough for json's recursion limit, short enough for the bound.
        lambda state: '{"tracestate": "' + state + '", "x": ' + "[" * 2000 + "]" * 2000 + "}",
        lambda state: json.dumps({"traceparent": TRACEPARENT, "tracestate": state + "\r\nFORGED"}),
        lambda state: json.dumps({"traceparent": TRACEPARENT + "\x1b[2J", "tracestate": state}),
        lambda state: "not json " + state + "\nFORGED",
        lambda state: json.dumps([state]),
        lambda state: json.dumps({"traceparent": "garbage", "tracestate": state}),
    ],
    ids=["nested-2000-deep", "tracestate-crlf", "traceparent-esc", "not-json", "array", "garbage"],
)
def test_a_context_that_cannot_be_restored_is_ignored_with_one_escaped_warning(
    carrier: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    stored = carrier(_unique_tracestate())
    for _ in range(3):  # three attempts, or three messages with this context
        headers: dict[str, str] = {}
        telemetry.propagate(headers, stored)
        assert headers == {}
        assert telemetry.restore(stored) is None
    [warning] = _warnings(caplog)
    assert "trace_context" in warning
    assert warning.isprintable()  # no CR, LF or ESC: one line, whoever writes it
    assert "FORGED" not in caplog.text.splitlines()


def test_a_context_over_the_bound_is_ignored_unread_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stored = json.dumps({"traceparent": TRACEPARENT, "pad": "x" * 5_000_000})
    for _ in range(3):
        assert telemetry.restore(stored) is None
    [warning] = _warnings(caplog)
    assert f"{len(stored)} characters" in warning
    assert str(telemetry.MAX_TRACE_CONTEXT_CHARS) in warning


def test_the_lease_stand_in_for_a_context_over_the_bound_is_ignored_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What lease_batch returns in place of a context over the bound (see queries.sql).
    stored = '{"' + telemetry.OVERSIZE_KEY + '" : 31457292}'
    for _ in range(3):
        headers: dict[str, str] = {}
        telemetry.propagate(headers, stored)
        assert headers == {}
    [warning] = _warnings(caplog)
    assert "31457292 characters" in warning


def test_the_lease_bounds_the_trace_context_it_returns_by_the_same_bound() -> None:
    statement = QUERIES["lease_batch"]
    assert f"length(leased.trace_context) <= {telemetry.MAX_TRACE_CONTEXT_CHARS}" in statement
    assert f"'{telemetry.OVERSIZE_KEY}'" in statement


def test_a_good_context_is_restored_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    stored = json.dumps({"traceparent": TRACEPARENT, "tracestate": _unique_tracestate()})
    context = telemetry.restore(stored)
    assert context is not None
    assert (
        format(trace.get_current_span(context).get_span_context().trace_id, "032x")
        == (TRACEPARENT.split("-")[1])
    )
    assert _warnings(caplog) == []


def test_the_documented_path_gives_the_sdk_set_up_and_the_api_side() -> None:
    assert public.configure is telemetry_setup.configure
    assert public.prometheus_text is telemetry_setup.prometheus_text
    assert public.Telemetry is telemetry.Telemetry
    assert public.capture is telemetry.capture


async def test_opening_a_relay_sets_up_no_sdk_even_where_the_environment_asks_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hosts set the SDK up before they open their relay (the Functions wiring, serve,
    # drain); a relay an application embeds uses whatever that application set up, or nothing.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    settings = Settings.load(database_url="postgresql://relay@127.0.0.1:9/outbox")
    relay = await Relay.open(settings)  # the pool connects on first use: nothing is reached
    await relay.close()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
