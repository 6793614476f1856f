"""The real OpenTelemetry SDK with in-memory exporters, for the relay's telemetry tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox.core.telemetry import Telemetry


@dataclass
class Sdk:
    """A tracer and a meter provider of their own (not the process's global ones)."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    spans_exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    @classmethod
    def start(cls) -> Sdk:
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        return cls(tracer_provider, MeterProvider(metric_readers=[reader]), exporter, reader)

    def telemetry(self) -> Telemetry:
        return Telemetry(self.tracer_provider, self.meter_provider)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        spans = list(self.spans_exporter.get_finished_spans())
        return [s for s in spans if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` collected now."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for found in scope.metrics
            if found.name == metric
            for point in found.data.data_points
        ]

    def all_attribute_values(self) -> Iterator[str]:
        """Every attribute value of every span, span link and metric point, as text."""
        for span in self.spans():
            yield from (str(v) for v in (span.attributes or {}).values())
            yield span.name
            for link in span.links:
                yield from (str(v) for v in (link.attributes or {}).values())
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        yield from (str(v) for v in point.attributes.values())

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
