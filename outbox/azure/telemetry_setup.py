"""The OpenTelemetry SDK's set-up: the exporters a process sends the relay's telemetry with.

The relay itself uses only the OpenTelemetry *API* (``outbox.core.telemetry``); choosing an SDK
and its exporters is the application's part, done once per process at its edge, before it opens
a relay: the Functions wiring (``outbox.azure.host``: ``configure(functions_host=True)``),
``outbox serve`` (``configure(prometheus=True)``) and ``outbox drain`` (``configure()``). An
application that embeds ``Relay`` calls ``outbox.telemetry.configure()`` itself, if it wants it.

It lives here, the lowest of the edges, because both of them call it: ``outbox.hosting`` may
import ``outbox.azure``, never the other way round. Its public path is ``outbox.telemetry``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace

from outbox.core.telemetry import SCOPE

logger = logging.getLogger("outbox.telemetry")

# The extras that ``configure()`` looks for.
AZURE_MONITOR_EXTRA = 'pip install "outbox-relay[azure-monitor]"'
OTLP_EXTRA = 'pip install "outbox-relay[otlp]"'
PROMETHEUS_EXTRA = 'pip install "outbox-relay[prometheus]"'
# What ``configure()`` set up in this process (the SDK is process-wide).
_configured: str | None = None
# Whether configure() set up the Prometheus exporter's reader (for GET /metrics).
_prometheus = False


def configure(
    environ: Mapping[str, str] | None = None,
    *,
    prometheus: bool = False,
    functions_host: bool = False,
) -> str | None:
    """Set up an OpenTelemetry SDK where the environment asks for one, once per process.

    - ``APPLICATIONINSIGHTS_CONNECTION_STRING`` set and ``azure-monitor-opentelemetry`` installed
      (the ``azure-monitor`` extra): ``configure_azure_monitor()``; with ``functions_host`` (the
      Functions wiring says so: no setting tells it on every plan) the logs are left to the host,
      which sends them to Application Insights already.
    - else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set and the
      OTLP exporter installed (the ``otlp`` extra): the SDK's tracer and meter providers with OTLP
      over HTTP, configured by the standard ``OTEL_*`` variables.

    ``prometheus`` (``outbox serve``): the metrics are also kept for ``GET /metrics`` where the
    Prometheus exporter is installed (the ``prometheus`` extra), through a reader of the same
    meter provider (one of its own where neither of the above is asked for); see
    ``prometheus_text``.

    Nothing is done where the application has set a tracer provider already, where nothing is
    asked for, or where ``OTEL_SDK_DISABLED`` is true. Returns what was set up: "azure-monitor",
    "otlp", "prometheus", or None.
    """
    global _configured  # noqa: PLW0603 - the SDK is process-wide
    env = os.environ if environ is None else environ
    if _configured is not None or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return _configured
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # the application configured its own SDK: use it as it is
    readers = _prometheus_readers() if prometheus else []
    if env.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):
        _configured = _azure_monitor(env, readers, functions_host=functions_host)
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        _configured = _otlp(env, readers)
    if _configured is None and readers:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", SCOPE)})
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
        _configured = "prometheus"
    global _prometheus  # noqa: PLW0603 - the SDK is process-wide
    _prometheus = bool(readers) and _configured is not None
    return _configured


def _prometheus_readers() -> list[Any]:
    """The Prometheus exporter's reader, where the ``prometheus`` extra is installed."""
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
    except ImportError:
        logger.info("GET /metrics needs the Prometheus exporter: %s", PROMETHEUS_EXTRA)
        return []
    return [PrometheusMetricReader()]


def prometheus_text() -> tuple[bytes, str] | None:
    """The process's metrics in Prometheus' text format, and its content type; None unless
    ``configure(prometheus=True)`` set the exporter up."""
    if not _prometheus:
        return None
    import prometheus_client

    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST


def _azure_monitor(
    env: Mapping[str, str], readers: list[Any], *, functions_host: bool
) -> str | None:
    try:
        from azure.monitor.opentelemetry import configure_azure_monitor
    except ImportError:
        # Usual on Azure (the host sends the logs to Application Insights by itself): not a fault.
        logger.info(
            "APPLICATIONINSIGHTS_CONNECTION_STRING is set; for the relay's traces and metrics "
            "there too: %s",
            AZURE_MONITOR_EXTRA,
        )
        return None
    if functions_host:
        # The distro takes its logging switch from OTEL_LOGS_EXPORTER alone (its disable_logging
        # argument is overwritten by it): without this, every log line went to Application
        # Insights twice, and the exporter's own INFO lines fed it without end.
        os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
    # The exporter's requests are logged by azure-core at INFO: never exported, nor shown.
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
    configure_azure_monitor(
        connection_string=env["APPLICATIONINSIGHTS_CONNECTION_STRING"],
        disable_logging=functions_host,
        **({"metric_readers": readers} if readers else {}),
    )
    return "azure-monitor"


def _otlp(env: Mapping[str, str], readers: list[Any]) -> str | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed (%s): "
            "no traces or metrics are exported",
            OTLP_EXTRA,
        )
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", SCOPE)})
    # OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER = none: that signal is not set up at all, so
    # the relay makes no calls for it (metrics alone cost much of the SDK's CPU:
    # docs/telemetry.md, "What it costs").
    if _exporter(env, "OTEL_TRACES_EXPORTER"):
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(tracer_provider)
    if _exporter(env, "OTEL_METRICS_EXPORTER"):
        readers = [PeriodicExportingMetricReader(OTLPMetricExporter()), *readers]
    if readers:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    return "otlp"


def _exporter(env: Mapping[str, str], name: str) -> bool:
    """Whether the standard variable ``name`` leaves that signal's OTLP exporter on."""
    return env.get(name, "otlp").strip().lower() != "none"
