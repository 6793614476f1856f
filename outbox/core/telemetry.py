"""OpenTelemetry: the producer's trace context kept with the row, spans and metrics of delivery.

Only the OpenTelemetry *API* is used here. With no SDK configured (the default) every span and
instrument is the API's no-op, and nothing is stored with a row; the SDK and its exporters are the
application's choice, set up at the edges (``outbox.telemetry.configure()``, from
``outbox.azure.telemetry_setup``, sets up Azure Monitor or OTLP where asked to, see
docs/telemetry.md).

- ``capture()`` (at enqueue): the active span's W3C ``traceparent``/``tracestate``, as JSON for the
  row's ``trace_context`` column; None without a valid active span.
- ``Telemetry.delivery()`` (the processor, per attempt): a CLIENT span ``deliver {event_type}``,
  child of the stored context (so the webhook's ``traceparent`` continues the producer's trace)
  and linked to the run's span; the metrics ``outbox.deliveries``, ``outbox.delivery.duration``
  and ``outbox.delivery.lag``.
- ``Telemetry.run()`` (the processor, per ``execute()``): an INTERNAL span ``outbox run``.
- ``record_backlog()`` (every status call, and the timer sweep): the figures behind the
  observable gauges ``outbox.backlog.*`` and ``outbox.breakers.open``;
  ``record_notify_queue_usage()`` (every status call, and ``serve``'s watch of the NOTIFY queue
  with ``OUTBOX_WAKEUP=postgres``): the gauge ``outbox.wakeup.notify_queue_usage``.

Attributes carry ids, names, counts, statuses and the receiver's host, never a URL's path or
query, a header, a secret or an error text.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outbox.core.models import DeliveryResult, DrainSummary, Response, TransportError
from outbox.core.text import escape_controls

logger = logging.getLogger("outbox.telemetry")

SCOPE = "outbox-relay"
VERSION = "0.2.0"
# Always W3C Trace Context, whatever propagators the application configured globally: the row
# and the webhook carry ``traceparent`` (and ``tracestate``), never baggage.
PROPAGATOR = TraceContextTextMapPropagator()
MESSAGING_SYSTEM = "outbox"
# A delivery's "span" while no SDK traces: nothing started, nothing made current.
_NO_SPAN = nullcontext(INVALID_SPAN)
# A stored trace context longer than this is not read (a W3C ``traceparent`` and ``tracestate``
# take under 1 KB); ``lease_batch`` does not even fetch one, returning in its place an object
# whose only key is OVERSIZE_KEY, with the context's length in characters.
# How long the backlog figures of a status call or a sweep stand (the timer sweeps every 300 s):
# after that the gauges report nothing, the sign alerts read of a relay that stopped sweeping.
BACKLOG_FRESH_SECONDS = 420.0
MAX_TRACE_CONTEXT_CHARS = 4096
OVERSIZE_KEY = "outbox_oversize_chars"
# How much of a context that cannot be restored its warning shows.
TRACE_CONTEXT_SHOWN_CHARS = 120
# The histograms' bucket boundaries, in seconds (the instruments' unit). OpenTelemetry's default
# boundaries (0, 5, 10, 25 … 10,000) are shaped for milliseconds: in seconds, every delivery under
# 5 s would share one bucket. A delivery is an HTTP request: OpenTelemetry's HTTP client buckets
# (5 ms to 10 s), then 30 s and 60 s for slow receivers (the timeout is 10 s by default).
DURATION_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0
)  # fmt: skip
# A message's lag: a wake-up's few milliseconds to the first attempt's seconds; then the sweep's
# five minutes (a lost wake-up) and retries' backoff (10 s doubling, at most 30 min apart).
LAG_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0
)  # fmt: skip


def capture() -> str | None:
    """The active span's W3C trace context as JSON text, or None without a valid active span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return json.dumps(carrier, separators=(",", ":"))


def restore(stored: str | None) -> Context | None:
    """The context a row's ``trace_context`` holds, or None: none stored, or one that cannot be
    restored (not a JSON object, nested too deeply, over ``MAX_TRACE_CONTEXT_CHARS``, control
    characters, no valid ``traceparent``). Such a context is ignored with one warning per value,
    and the message is delivered without it: a producer's trace never stops a delivery."""
    if not stored:
        return None
    if len(stored) > MAX_TRACE_CONTEXT_CHARS:
        _ignored(_over_the_bound(len(stored)), "")
        return None
    return _restored(stored)


class _UnrestorableError(Exception):
    """Why a stored trace context is ignored."""


@functools.lru_cache(maxsize=256)
def _restored(stored: str) -> Context | None:
    """``restore()`` of a value within the bound; cached, so a bad value warns once, and each
    attempt at a message does not parse its context again (a Context is immutable)."""
    try:
        context = PROPAGATOR.extract(_carrier(stored))
        if not trace.get_current_span(context).get_span_context().is_valid:
            raise _UnrestorableError("no valid traceparent")
    except _UnrestorableError as exc:
        return _ignored(str(exc), stored)
    except Exception as exc:  # noqa: BLE001 - whatever the propagator raises, the message goes
        return _ignored(f"{type(exc).__name__} while reading it", stored)
    return context


def _carrier(stored: str) -> dict[str, str]:
    """The ``traceparent`` and ``tracestate`` a stored context holds, as the propagator reads
    them; ``_UnrestorableError`` says why there are none to read."""
    try:
        carrier = json.loads(stored)
    except RecursionError as exc:
        raise _UnrestorableError("nested too deeply") from exc
    except ValueError as exc:
        raise _UnrestorableError("not JSON") from exc
    if not isinstance(carrier, dict):
        raise _UnrestorableError("not a JSON object")
    if isinstance(size := carrier.get(OVERSIZE_KEY), int):
        raise _UnrestorableError(_over_the_bound(size))
    fields = {key: carrier[key] for key in ("traceparent", "tracestate") if key in carrier}
    if not all(isinstance(value, str) and value.isprintable() for value in fields.values()):
        raise _UnrestorableError("its traceparent or tracestate is not printable text")
    return fields


def _over_the_bound(chars: int) -> str:
    return f"{chars} characters, over {MAX_TRACE_CONTEXT_CHARS}"


@functools.lru_cache(maxsize=256)
def _ignored(reason: str, stored: str) -> None:
    """Warn, once per value, that a stored trace context is ignored (its start shown, escaped)."""
    shown = escape_controls(stored[:TRACE_CONTEXT_SHOWN_CHARS])
    if len(stored) > TRACE_CONTEXT_SHOWN_CHARS:
        shown += "…"
    logger.warning(
        "a message's stored trace_context is ignored (%s), and the message delivered without it%s",
        reason,
        f": {shown}" if shown else "",
    )


def propagate(headers: dict[str, str], stored: str | None) -> None:
    """Add ``traceparent`` (and ``tracestate``) to a webhook's ``headers``: the current span's
    (the delivery's), else, with no SDK recording one, the ``stored`` context as it is, checked."""
    PROPAGATOR.inject(headers)
    if stored and "traceparent" not in headers and (context := restore(stored)) is not None:
        PROPAGATOR.inject(headers, context)


def trace_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, for log records; None without one."""
    return span_ids(trace.get_current_span().get_span_context())


def span_ids(context: SpanContext | None) -> tuple[str, str] | None:
    if context is None or not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


@dataclass(slots=True)
class Backlog:
    """The latest backlog figures this process saw (a status call or the timer's sweep)."""

    counts: Mapping[str, int] = field(default_factory=dict)
    oldest_unpublished_age_seconds: float | None = None
    open_breakers: int = 0


class Telemetry:
    """The relay's tracer and instruments, from the given providers (by default the global ones,
    which are no-ops until an SDK is configured, and follow it once it is).

    While the global providers are the API's own (no SDK), no span is started and no instrument
    is called at all: ``tracing`` and ``metering`` say so, read again at each run's start.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._own_providers = (tracer_provider is not None, meter_provider is not None)
        self.tracing, self.metering = self._own_providers
        self.refresh()
        self.tracer = trace.get_tracer(SCOPE, VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, VERSION, meter_provider=meter_provider)
        self.deliveries = meter.create_counter(
            "outbox.deliveries",
            unit="{delivery}",
            description="Webhook delivery attempts, by outcome, event type and endpoint",
        )
        self.duration = meter.create_histogram(
            "outbox.delivery.duration",
            unit="s",
            description="Duration of one webhook delivery attempt",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_SECONDS,
        )
        self.lag = meter.create_histogram(
            "outbox.delivery.lag",
            unit="s",
            description="Time from a message's creation to its endpoint's 2xx",
            explicit_bucket_boundaries_advisory=LAG_BUCKETS_SECONDS,
        )
        self.backlog: Backlog | None = None
        self._backlog_at = 0.0  # when (monotonic) it was recorded
        self.clock = time.monotonic
        self.notify_queue_usage: float | None = None
        meter.create_observable_gauge(
            "outbox.backlog.messages",
            callbacks=[self._observe_counts],
            unit="{message}",
            description="Outbox messages by status, as of the latest status call or sweep",
        )
        meter.create_observable_gauge(
            "outbox.backlog.oldest_unpublished_age",
            callbacks=[self._observe_oldest],
            unit="s",
            description="Age of the oldest Pending or Processing message",
        )
        meter.create_observable_gauge(
            "outbox.breakers.open",
            callbacks=[self._observe_breakers],
            unit="{endpoint}",
            description="Endpoints whose circuit breaker is open",
        )
        meter.create_observable_gauge(
            "outbox.wakeup.notify_queue_usage",
            callbacks=[self._observe_notify_queue],
            unit="1",
            description="Fraction of PostgreSQL's NOTIFY queue in use (full: NOTIFY fails)",
        )

    def refresh(self) -> None:
        """Whether an SDK records spans or metrics now (one may have been set up since)."""
        own_tracer, own_meter = self._own_providers
        self.tracing = own_tracer or not isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
        )
        self.metering = own_meter or type(metrics.get_meter_provider()).__name__ not in {
            "_ProxyMeterProvider",  # the API's stand-in until a provider is set
            "NoOpMeterProvider",
        }

    def observing(self, span: Span) -> bool:
        """Whether a delivery's outcome is wanted: its span records, or metrics are on."""
        return self.metering or span.is_recording()

    @contextmanager
    def run(self, trigger: str) -> Iterator[Span]:
        """The span of one processor run, current inside the block."""
        self.refresh()
        if not self.tracing:
            yield INVALID_SPAN
            return
        with self.tracer.start_as_current_span(
            "outbox run",
            kind=SpanKind.INTERNAL,
            attributes={"outbox.trigger": trigger},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def delivery(
        self,
        *,
        message_id: str,
        event_type: str,
        endpoint: str,
        url: str,
        attempt: int,
        stored: str | None,
    ) -> AbstractContextManager[Span]:
        """The span of one delivery attempt, current inside the block (the webhook's
        ``traceparent`` is taken from it) and ended when the block ends: a child of the
        producer's stored context (and linked to the current run's span), else of the current
        run's span. No span at all while no SDK traces."""
        if not self.tracing:
            return _NO_SPAN
        parent = restore(stored)
        links = None
        if parent is not None:
            run = trace.get_current_span().get_span_context()
            links = [Link(run)] if run.is_valid else None
        host, port = _server(url)
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.name": "deliver",
            "messaging.operation.type": "send",
            "messaging.destination.name": event_type,
            "messaging.message.id": message_id,
            "outbox.event_type": event_type,
            "outbox.endpoint": endpoint,
            "outbox.attempt": attempt,
            "http.request.method": "POST",
        }
        if host:
            attributes["server.address"] = host
        if port:
            attributes["server.port"] = port
        span = self.tracer.start_span(
            f"deliver {event_type}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=links,
        )
        return _current(span)

    def delivered(
        self,
        span: Span,
        result: DeliveryResult,
        *,
        event_type: str,
        endpoint: str,
        outcome: str,
        seconds: float,
        created_at: datetime,
        now: datetime,
    ) -> None:
        """Give a delivery's span its outcome, and count the delivery. ``now`` (the database's
        clock, as ``created_at``) gives a 2xx its lag."""
        status_code, error_type = _described(result)
        if span.is_recording():
            span.set_attribute("outbox.outcome", outcome)
            if status_code is not None:
                span.set_attribute("http.response.status_code", status_code)
            if error_type is not None:
                span.set_attribute("error.type", error_type)
                span.set_status(StatusCode.ERROR)
        if not self.metering:
            return
        attributes = {"outcome": outcome, "event_type": event_type, "endpoint": endpoint}
        self.deliveries.add(1, attributes)
        self.duration.record(seconds, attributes)
        if error_type is None:
            lag = max((now - created_at).total_seconds(), 0.0)
            self.lag.record(lag, {"event_type": event_type, "endpoint": endpoint})

    def ran(self, span: Span, summary: DrainSummary) -> None:
        """Give a run's span what it did."""
        if not span.is_recording():
            return
        span.set_attributes(
            {
                "outbox.leased": summary.leased,
                "outbox.processed": summary.processed,
                "outbox.retried": summary.retried,
                "outbox.failed": summary.failed,
                "outbox.released": summary.released,
            }
        )
        if summary.error:
            # Only its kind: the text is for the logs.
            span.set_attribute("error.type", "database" if "database" in summary.error else "run")
            span.set_status(StatusCode.ERROR)

    def record_backlog(self, backlog: Backlog) -> None:
        self.backlog = backlog
        self._backlog_at = self.clock()

    def _fresh_backlog(self) -> Backlog | None:
        """The backlog figures while they are recent: a process whose sweeps stopped (its
        database unreachable, say) stops reporting them, so that an alert on their absence fires
        rather than one on their value going stale."""
        if self.backlog is None or self.clock() - self._backlog_at > BACKLOG_FRESH_SECONDS:
            return None
        return self.backlog

    def record_notify_queue_usage(self, usage: float) -> None:
        self.notify_queue_usage = usage

    def _observe_counts(self, options: CallbackOptions) -> Iterator[Observation]:
        if (backlog := self._fresh_backlog()) is not None:
            for status, count in backlog.counts.items():
                yield Observation(count, {"status": status})

    def _observe_oldest(self, options: CallbackOptions) -> Iterator[Observation]:
        if (backlog := self._fresh_backlog()) is not None:
            yield Observation(backlog.oldest_unpublished_age_seconds or 0.0)

    def _observe_breakers(self, options: CallbackOptions) -> Iterator[Observation]:
        if (backlog := self._fresh_backlog()) is not None:
            yield Observation(backlog.open_breakers)

    def _observe_notify_queue(self, options: CallbackOptions) -> Iterator[Observation]:
        if self.notify_queue_usage is not None:
            yield Observation(self.notify_queue_usage)


@contextmanager
def _current(span: Span) -> Iterator[Span]:
    """``span`` current inside the block, ended after it; an exception marks it with its kind
    only (its text may hold a URL)."""
    try:
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield span
    except BaseException as exc:
        if span.is_recording():
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(StatusCode.ERROR)
        raise
    finally:
        span.end()


@functools.lru_cache(maxsize=256)
def _server(url: str) -> tuple[str | None, int | None]:
    """The receiver's host and port: never its path, query or user info (they may hold secrets)."""
    try:
        parts = urlsplit(url)
        return parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None, None


def _described(result: DeliveryResult) -> tuple[int | None, str | None]:
    """A result's HTTP status code (if it had one) and its ``error.type`` (None for a 2xx)."""
    if isinstance(result, Response):
        return result.status, None if 200 <= result.status < 300 else str(result.status)
    if isinstance(result, TransportError):
        return None, result.error_class
    return None, type(result).__name__


_process: Telemetry | None = None


def process_telemetry() -> Telemetry:
    """The process's telemetry over the global providers (made on first use)."""
    global _process  # noqa: PLW0603 - one set of instruments per process
    if _process is None:
        _process = Telemetry()
    return _process
