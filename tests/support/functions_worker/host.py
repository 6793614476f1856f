"""The Functions host's side of the worker protocol, run as a script by the deployed Python.

    python -S -P host.py --worker <worker folder> --app <app folder>

On Python 3.13 the platform starts its "proxy worker", which loads Microsoft's runtime library
``azure-functions-runtime`` from the app and hands it each message of the host as a
``WorkerRequest`` carrying the ``protos`` module compiled from FunctionRpc.proto. The C# host
cannot run here, so this script does what the host and the proxy worker do between them
(Azure/azure-functions-python-worker, ``workers/proxy_worker/``): it orders ``sys.path`` as the
worker's DependencyManager does, sends the init, metadata and load requests, then one invocation
request per line the test writes, on one event loop for the whole process (the relay opens its
database pool on its first invocation and keeps it). Log records reach the host through a root
handler, as the worker forwards them.

It imports only the standard library, the worker folder (``protos``, ``google.protobuf``, the
worker's ``uvloop``) and the app's ``.python_packages``: ``-S`` keeps the interpreter's own
site-packages out and ``-P`` this script's folder, so nothing of the test's environment is seen.

The protocol is JSON lines. stdout first gives the ready line, ``{"ready": true, "functions":
{name: [bindings]}, "python": version, "runtime": path}`` or ``{"ready": false, "error": ...}``.
stdin then takes ``{"invoke": name, "queue"|"timer"|"http": {...}}``, each answered with
``{"status", "exception", "stack_trace", "http", "logs", "traceparent"}`` (or ``{"error": ...}``
for a request that cannot be sent), and ``{"stop": true}``, answered ``{"stopped": true}`` once
the telemetry is flushed. Everything else the process writes (the app's ``print``, logs outside
an invocation) goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import importlib
import json
import logging
import os
import platform
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

Json = dict[str, Any]

# The host this stands in for (any 4.x host speaks this contract to the worker).
HOST_VERSION = "4.1040.0"
# Records of the invocation being run; unset outside invocations.
CAPTURED: contextvars.ContextVar[list[str]] = contextvars.ContextVar("captured")


@dataclasses.dataclass
class WorkerRequest:
    """The shape the proxy worker hands the runtime (``proxy_worker.dispatcher.WorkerRequest``)."""

    name: str
    request: Any
    properties: dict[str, Any] | None = None


class Forwarder(logging.Handler):
    """Stands in for the worker's AsyncLoggingHandler, which sends each record to the host:
    records of an invocation go into its answer, the others to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        line = f"{record.levelname} {record.name}: {self.format(record)}"
        captured = CAPTURED.get(None)
        if captured is None:
            print(line, file=sys.stderr, flush=True)
        else:
            captured.append(line)


def claim_stdout() -> IO[str]:
    """The protocol's own copy of stdout; fd 1 (``print``, the runtime's flushes) goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    return protocol


def use_worker_dependencies(worker: Path) -> None:
    """At start the worker imports from its own folder only (``use_worker_dependencies``)."""
    here = str(Path(__file__).resolve().parent)
    rest = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    sys.path[:] = [str(worker), str(worker / "site"), *rest]


def prioritize_customer_dependencies(app: Path, worker: Path) -> None:
    """Before init the worker puts the app's packages first, its own next and the app folder
    last (``DependencyManager.prioritize_customer_dependencies``)."""
    ours = [str(worker), str(worker / "site")]
    packages = str(app / ".python_packages" / "lib" / "site-packages")
    rest = [p for p in sys.path if p not in ours]
    sys.path[:] = [packages, *ours, *rest, str(app)]


def setup_logging() -> None:
    """The root logger at INFO (DEBUG with PYTHON_ENABLE_DEBUG_LOGGING), as the worker sets it."""
    debug = os.environ.get("PYTHON_ENABLE_DEBUG_LOGGING", "").lower() in {"1", "true"}
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.addHandler(Forwarder())


def iso(moment: datetime) -> str:
    """A time as the host's JSON writes a DateTimeOffset (queue times are whole seconds)."""
    return moment.isoformat(timespec="seconds")


class Host:
    """The host's requests to the runtime, each built as the host builds it."""

    def __init__(self, protos: Any, runtime: Any, app: Path, worker: Path) -> None:
        self.protos = protos
        self.runtime = runtime
        self.app = app
        self.worker = worker
        self.request_id = str(uuid.uuid4())
        self.functions: dict[str, Any] = {}  # name -> RpcFunctionMetadata

    def message(self, **content: Any) -> Any:
        return self.protos.StreamingMessage(request_id=self.request_id, **content)

    async def start(self) -> Json:
        """Init (the runtime indexes the app here), metadata, then a load for every function."""
        protos, runtime = self.protos, self.runtime
        runtime.start_threadpool_executor()  # as the proxy worker does before init
        init = await runtime.worker_init_request(
            WorkerRequest(
                "WorkerInitRequest",
                self.message(
                    worker_init_request=protos.WorkerInitRequest(
                        host_version=HOST_VERSION,
                        worker_directory=str(self.worker),
                        function_app_directory=str(self.app),
                    )
                ),
                {"protos": protos, "host": "127.0.0.1"},
            )
        )
        if error := self.failure(init.result):
            return {"ready": False, "error": f"init: {error}"}
        request = protos.FunctionsMetadataRequest(function_app_directory=str(self.app))
        metadata = await runtime.functions_metadata_request(
            WorkerRequest("WorkerMetadataRequest", self.message(functions_metadata_request=request))
        )
        if error := self.failure(metadata.result):
            return {"ready": False, "error": f"metadata: {error}"}
        for function in metadata.function_metadata_results:
            if error := await self.load(function):
                return {"ready": False, "error": f"load {function.name}: {error}"}
            self.functions[function.name] = function
        return {
            "ready": True,
            "functions": {
                name: [json.loads(raw) for raw in function.raw_bindings]
                for name, function in self.functions.items()
            },
            "python": platform.python_version(),
            "runtime": runtime.__file__,
        }

    async def load(self, function: Any) -> str | None:
        request = self.protos.FunctionLoadRequest(
            function_id=function.function_id, metadata=function
        )
        loaded = await self.runtime.function_load_request(
            WorkerRequest("FunctionLoadRequest", self.message(function_load_request=request))
        )
        return self.failure(loaded.result)

    def failure(self, result: Any) -> str | None:
        if result.status == self.protos.StatusResult.Success:
            return None
        return f"{result.exception.message}\n{result.exception.stack_trace}"

    async def invoke(self, request: Json) -> Json:
        """One invocation request; its answer carries the records logged while it ran."""
        function = self.functions[request["invoke"]]
        input_data, trigger_metadata = self.trigger(function, request)
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
        invocation = self.protos.InvocationRequest(
            invocation_id=str(uuid.uuid4()),
            function_id=function.function_id,
            input_data=input_data,
            trigger_metadata=trigger_metadata,
            trace_context=self.protos.RpcTraceContext(trace_parent=traceparent),
        )
        records: list[str] = []
        CAPTURED.set(records)  # this task's own context: the next invocation starts afresh
        response = await self.runtime.invocation_request(
            WorkerRequest("FunctionInvocationRequest", self.message(invocation_request=invocation))
        )
        return self.answer(response, records) | {"traceparent": traceparent}

    def trigger(self, function: Any, request: Json) -> tuple[list[Any], dict[str, Any]]:
        """The trigger's parameter binding and metadata, as the host sends them."""
        [binding] = [
            b for b in map(json.loads, function.raw_bindings) if b["type"].endswith("Trigger")
        ]
        kind = binding["type"].removesuffix("Trigger")
        if kind not in request:
            raise ValueError(
                f"{function.name} has a {binding['type']}: send {kind!r}, not {request}"
            )
        now = datetime.now(UTC)
        if kind == "queue":
            data, metadata = self.queue(request["queue"], now)
        elif kind == "timer":
            data, metadata = self.timer(request["timer"], binding, now), {}
        elif kind == "http":
            data, metadata = self.http(request["http"]), {}
        else:
            raise ValueError(f"{function.name}: no stand-in for a {binding['type']}")
        if kind != "http":  # the host's own binding data, sent with every non-HTTP trigger
            metadata["sys"] = self.json(
                {
                    "MethodName": function.name,
                    "UtcNow": now.isoformat(),
                    "RandGuid": str(uuid.uuid4()),
                }
            )
        return [self.protos.ParameterBinding(name=binding["name"], data=data)], metadata

    def json(self, value: Any) -> Any:
        """Non-string binding data: the host sends it as JSON."""
        return self.protos.TypedData(json=json.dumps(value))

    def queue(self, queue: Json, now: datetime) -> tuple[Any, dict[str, Any]]:
        typed = self.protos.TypedData
        body = queue["body"]
        metadata = {
            "QueueTrigger": typed(string=body),
            "Id": typed(string=queue.get("id") or str(uuid.uuid4())),
            "PopReceipt": typed(string=uuid.uuid4().hex),
            "DequeueCount": self.json(queue.get("dequeue_count", 1)),
            "InsertionTime": self.json(iso(now)),
            "ExpirationTime": self.json(iso(now + timedelta(days=7))),
            "NextVisibleTime": self.json(iso(now + timedelta(seconds=30))),
        }
        return typed(string=body), metadata

    def timer(self, timer: Json, binding: Json, now: datetime) -> Any:
        status = {
            "Last": iso(now - timedelta(minutes=5)),
            "Next": iso(now + timedelta(minutes=5)),
            "LastUpdated": iso(now - timedelta(minutes=5)),
        }
        return self.json(
            {
                "Schedule": {"AdjustForDST": True},
                "ScheduleStatus": status if binding.get("useMonitor") else None,
                "IsPastDue": bool(timer.get("past_due", False)),
            }
        )

    def http(self, http: Json) -> Any:
        """The runtime announces RawHttpBodyBytes and RpcHttpTriggerMetadataRemoved, so the host
        sends the body as bytes and no trigger metadata."""
        protos = self.protos
        return protos.TypedData(
            http=protos.RpcHttp(
                method=http["method"],
                url=http["url"],
                headers=http.get("headers") or {},
                query=http.get("query") or {},
                params=http.get("params") or {},
                body=protos.TypedData(bytes=http.get("body", "").encode()),
            )
        )

    def answer(self, response: Any, records: list[str]) -> Json:
        result = response.result
        failed = result.status != self.protos.StatusResult.Success
        return {
            "status": self.protos.StatusResult.Status.Name(result.status),
            "exception": result.exception.message if failed else None,
            "stack_trace": result.exception.stack_trace if failed else None,
            "http": self.http_answer(response.return_value),
            "logs": records,
        }

    @staticmethod
    def http_answer(value: Any) -> Json | None:
        if value.WhichOneof("data") != "http":
            return None
        body = value.http.body
        kind = body.WhichOneof("data")
        raw = getattr(body, kind) if kind else ""
        return {
            "status": int(value.http.status_code or 200),
            "headers": dict(value.http.headers),
            "body": raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw),
        }


def flush_telemetry() -> None:
    """Export what the app's OpenTelemetry providers still hold before the process ends (their
    exit hooks would, but the tests read the export and a worker may be killed instead)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return
    providers: list[Any] = [trace.get_tracer_provider(), metrics.get_meter_provider()]
    try:
        from opentelemetry import _logs
    except ImportError:
        pass
    else:
        providers.append(_logs.get_logger_provider())
    for provider in providers:
        for method in ("force_flush", "shutdown"):
            if callable(call := getattr(provider, method, None)):
                call()


def send(protocol: IO[str], answer: Json) -> None:
    protocol.write(json.dumps(answer) + "\n")
    protocol.flush()


async def serve(host: Host, protocol: IO[str]) -> int:
    """The ready line, then one answer per request line until stop (or the end of stdin)."""

    # Each request runs in a task of its own, as the worker dispatches them: what one
    # invocation leaves in its context does not leak into the next.
    ready = await asyncio.create_task(host.start())
    send(protocol, ready)
    if not ready["ready"]:
        return 1
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
        request = json.loads(line)
        if request.get("stop"):
            break
        try:
            send(protocol, await asyncio.create_task(host.invoke(request)))
        except (KeyError, TypeError, ValueError) as error:
            send(protocol, {"error": f"bad request {request}: {error!r}"})
    await loop.run_in_executor(None, flush_telemetry)
    host.runtime.stop_threadpool_executor()
    send(protocol, {"stopped": True})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, required=True, help="protos/ and site/")
    parser.add_argument("--app", type=Path, required=True, help="the built app folder")
    args = parser.parse_args()
    protocol = claim_stdout()
    use_worker_dependencies(args.worker)
    import uvloop  # the 3.13 worker ships it and runs its loop on it (proxy_worker.start_worker)

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    protos = importlib.import_module("protos")
    prioritize_customer_dependencies(args.app, args.worker)
    setup_logging()
    try:
        runtime = importlib.import_module("azure_functions_runtime")
    except ImportError as error:
        send(protocol, {"ready": False, "error": f"the app does not ship the runtime: {error!r}"})
        return 1
    return asyncio.run(serve(Host(protos, runtime, args.app, args.worker), protocol))


if __name__ == "__main__":
    sys.exit(main())
