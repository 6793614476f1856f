"""The Functions app as Flex Consumption builds it and runs it on Python 3.13.

``build_app()`` makes the artifact the platform runs: what ``.funcignore`` leaves of the
repository, and ``requirements.txt`` installed into ``.python_packages`` by Python 3.13 (the remote
build installs that file and nothing else). ``FunctionsWorker`` loads it under Microsoft's worker
runtime (``azure-functions-runtime``), with ``functions_worker/host.py`` playing the host, and
invokes its functions as triggers would. A test that ran the functions in the dev venv would prove
the code; this proves the deployment.

The installs are cached under ``.venv/deployment-cache/`` (git-ignored with ``.venv``), keyed by
what they are made from; the app's own sources are copied afresh for every build.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from tests.support.processes import ROOT

WORKER_SOURCES = Path(__file__).resolve().parent / "functions_worker"
PROTO_SOURCES = WORKER_SOURCES / "proto"
PROTO_FILES = (
    "FunctionRpc.proto",
    "identity/ClaimsIdentityRpc.proto",
    "shared/NullableTypes.proto",
)
HOST_SCRIPT = WORKER_SOURCES / "host.py"
CACHE = ROOT / ".venv" / "deployment-cache"

# What the package must hold: a new top-level file is either deployed on purpose or ignored.
DEPLOYED = ("function_app.py", "host.json", "migrations", "outbox", "requirements.txt")
# Left out by Core Tools whatever .funcignore says (FileSystemHelpers.GetLocalFiles).
ALWAYS_LEFT_OUT_DIRECTORIES = frozenset({".git", ".vscode"})
ALWAYS_LEFT_OUT_FILES = frozenset(
    {".funcignore", ".gitignore", "local.settings.json", "project.lock.json"}
)
# The Python 3.13 worker's own pins (azure-functions-python-worker, workers/pyproject.toml): its
# protobuf runtime, the generator whose code that runtime loads, and its event loop.
WORKER_PACKAGES = ("protobuf~=5.29.0", "uvloop~=0.21.0")
PROTOC = "grpcio-tools~=1.70.0"
PROTOS_INIT = '''"""The messages of FunctionRpc.proto, the module the worker hands the runtime."""

from .FunctionRpc_pb2 import *
from .identity.ClaimsIdentityRpc_pb2 import *
from .shared.NullableTypes_pb2 import *
'''
# Ready and answer lines carry whole HTTP bodies (the console's page among them).
LINE_LIMIT = 16 * 1024 * 1024
_PIP_TARGET = ("-m", "pip", "install", "-q", "--target")
_PROBE = "import sys; assert sys.version_info[:2] == (3, 13); print(sys.executable)"


@dataclass(frozen=True)
class DeployedApp:
    """A built app: ``app`` is the folder the platform runs (``/home/site/wwwroot``), ``worker``
    the worker's side (the compiled ``protos`` and its own packages in ``site``)."""

    app: Path
    worker: Path
    python: str

    @property
    def site_packages(self) -> Path:
        return self.app / ".python_packages" / "lib" / "site-packages"


def deployed_python() -> str:
    """A Python 3.13 (the template's version): ``python3.13`` on PATH or one of pyenv's. The path
    of the interpreter itself, so that no shim or environment stands between it and the tests."""
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates = [shutil.which("python3.13"), *sorted(map(str, pyenv.glob("3.13*/bin/python3.13")))]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", _PROBE], capture_output=True, text=True, check=False
        )
        if probe.returncode == 0:
            return probe.stdout.strip()
    raise RuntimeError(
        "the deployment tests need Python 3.13 (what the template deploys): put python3.13 on "
        "PATH or install it with pyenv (`pyenv install 3.13`)"
    )


def build_app(folder: Path, python: str) -> DeployedApp:
    """The app in ``folder/app`` as the Flex remote build leaves it (its ``.python_packages``
    linked to the cached install), and the worker that runs it."""
    copy_package(ROOT, folder / "app")
    cached = cached_build(python, folder / "app" / "requirements.txt")
    deployed = DeployedApp(app=folder / "app", worker=cached / "worker", python=python)
    deployed.site_packages.parent.mkdir(parents=True)
    deployed.site_packages.symlink_to(cached / "site-packages", target_is_directory=True)
    return deployed


# -- the package: what .funcignore leaves -----------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """One line of ``.funcignore`` (gitignore syntax, as Core Tools reads it)."""

    glob: str
    directories_only: bool
    anchored: bool
    negated: bool

    @classmethod
    def parse(cls, line: str) -> Pattern | None:
        line = line.strip()
        if not line or line.startswith("#"):
            return None
        negated = line.startswith("!")
        line = line.removeprefix("!")
        directories_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line  # a slash before the end ties it to the root
        return cls(line.lstrip("/"), directories_only, anchored, negated)

    def matches(self, path: PurePosixPath, is_dir: bool) -> bool:
        if self.directories_only and not is_dir:
            return False
        return fnmatch.fnmatchcase(str(path) if self.anchored else path.name, self.glob)


def funcignore(root: Path) -> list[Pattern]:
    lines = (root / ".funcignore").read_text().splitlines()
    return [p for p in map(Pattern.parse, lines) if p is not None]


def left_out(path: PurePosixPath, is_dir: bool, patterns: list[Pattern]) -> bool:
    always = ALWAYS_LEFT_OUT_DIRECTORIES if is_dir else ALWAYS_LEFT_OUT_FILES
    verdict = path.name in always
    for pattern in patterns:
        if pattern.matches(path, is_dir):
            verdict = not pattern.negated
    return verdict


def copy_package(root: Path, app: Path) -> None:
    """Copy what the deployment package holds; fail if that is not exactly ``DEPLOYED``."""
    patterns = funcignore(root)
    kept = [e for e in root.iterdir() if not left_out(PurePosixPath(e.name), e.is_dir(), patterns)]
    names = sorted(entry.name for entry in kept)
    if names != sorted(DEPLOYED):
        raise AssertionError(
            f".funcignore leaves {names} of the repository, not {sorted(DEPLOYED)}: ignore "
            "what the app does not need, or add it to DEPLOYED"
        )

    def ignored(directory: str, names: list[str]) -> set[str]:
        relative = PurePosixPath(Path(directory).relative_to(root))
        return {n for n in names if left_out(relative / n, Path(directory, n).is_dir(), patterns)}

    app.mkdir(parents=True)
    for entry in kept:
        if entry.is_dir():
            shutil.copytree(entry, app / entry.name, ignore=ignored)
        else:
            shutil.copy2(entry, app / entry.name)


# -- the installs: the remote build and the worker, cached ------------------------------------


def cached_build(python: str, requirements: Path) -> Path:
    """``site-packages`` (the remote build) and ``worker`` for these inputs, built once."""
    entry = CACHE / build_key(python, requirements)
    if entry.is_dir():
        return entry
    CACHE.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{entry.name}.", dir=CACHE))
    try:
        remote_build(python, requirements, scratch / "site-packages")
        build_worker(python, scratch / "worker")
        try:
            scratch.rename(entry)  # whole or not at all
        except OSError:
            if not entry.is_dir():  # unless another run has just built the same
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return entry


def build_key(python: str, requirements: Path) -> str:
    digest = hashlib.sha256()
    version = _run(python, "-c", "import sys; print(sys.version)", cwd=ROOT)
    for part in (version, requirements.read_text(), PROTOC, *WORKER_PACKAGES, PROTOS_INIT):
        digest.update(part.encode() + b"\0")
    for name in PROTO_FILES:
        digest.update(name.encode() + b"\0" + (PROTO_SOURCES / name).read_bytes())
    return digest.hexdigest()[:16]


def remote_build(python: str, requirements: Path, target: Path) -> None:
    """What the Flex remote build runs in the app folder: requirements.txt and nothing else."""
    _run(
        python,
        *("-m", "pip", "install", "-q", "--target", str(target), "-r", requirements.name),
        cwd=requirements.parent,
    )


def build_worker(python: str, worker: Path) -> None:
    """The worker's side: ``protos`` compiled from the vendored contract by the generator the
    worker pins (installed for this alone), and the worker's own packages in ``site``."""
    protos = worker / "protos"
    protos.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="protoc-") as protoc:
        _run(python, *_PIP_TARGET, protoc, PROTOC, cwd=ROOT)
        _run(
            python,
            *("-m", "grpc_tools.protoc", f"-I{PROTO_SOURCES}", f"--python_out={protos}"),
            *PROTO_FILES,
            cwd=PROTO_SOURCES,
            extra_env={"PYTHONPATH": protoc},
        )
    make_package(protos)
    _run(python, *_PIP_TARGET, str(worker / "site"), *WORKER_PACKAGES, cwd=ROOT)


def make_package(protos: Path) -> None:
    """protoc imports one generated module from another absolutely (``from shared import``);
    made relative, they load as the package ``protos`` wherever the worker folder is."""
    folders = sorted(p.name for p in PROTO_SOURCES.iterdir() if p.is_dir())
    absolute = re.compile(rf"^from ({'|'.join(folders)}) import", re.MULTILINE)
    for module in protos.rglob("*_pb2.py"):
        dots = "." * len(module.relative_to(protos).parts)
        module.write_text(absolute.sub(rf"from {dots}\1 import", module.read_text()))
    for folder in folders:
        (protos / folder / "__init__.py").touch()
    (protos / "__init__.py").write_text(PROTOS_INIT)


def _run(*args: str, cwd: Path, extra_env: Mapping[str, str] | None = None) -> str:
    env = os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1", **(extra_env or {})}
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


# -- running it under Microsoft's worker runtime ----------------------------------------------


@dataclass(frozen=True)
class HttpResult:
    """The HTTP response a function returned, as the host receives it."""

    status: int
    headers: dict[str, str]
    body: str

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Invocation:
    """What the runtime answered one invocation request with, and what it logged meanwhile."""

    status: str  # "Success" or "Failure"
    exception: str | None
    stack_trace: str | None
    http: HttpResult | None
    logs: list[str]
    traceparent: str  # the trace context the host sent

    @classmethod
    def parse(cls, answer: dict[str, Any]) -> Invocation:
        http = answer["http"]
        return cls(
            status=answer["status"],
            exception=answer["exception"],
            stack_trace=answer["stack_trace"],
            http=HttpResult(**http) if http is not None else None,
            logs=answer["logs"],
            traceparent=answer["traceparent"],
        )


class FunctionsWorker:
    """The built app under Microsoft's worker runtime in a Python 3.13 process of its own.

    ``env`` is the app's settings: the process gets exactly these, plus ``PATH``, the
    ``AzureWebJobsScriptRoot`` the host sets and ``PYTHONDONTWRITEBYTECODE`` (the platform's
    package is read-only), and nothing of the test's own environment::

        async with FunctionsWorker(deployed, {"OUTBOX_DATABASE_URL": url}) as worker:
            result = await worker.invoke_http("outbox_status", "GET", "/api/outbox/status")
    """

    def __init__(
        self,
        deployed: DeployedApp,
        env: Mapping[str, str],
        *,
        start_timeout: float = 120,
        invocation_timeout: float = 300,
    ) -> None:
        self.deployed = deployed
        self.env = {
            "PATH": os.environ["PATH"],
            "AzureWebJobsScriptRoot": str(deployed.app),
            # The platform mounts the package read-only: nothing is written into it.
            "PYTHONDONTWRITEBYTECODE": "1",
            **env,
        }
        self.start_timeout = start_timeout
        self.invocation_timeout = invocation_timeout
        self.functions: dict[str, list[dict[str, Any]]] = {}
        self.python_version = ""
        self.runtime_path = Path()
        self.returncode: int | None = None
        self._stderr: list[str] = []
        self._process: asyncio.subprocess.Process | None = None
        self._stderr_reader: asyncio.Task[None] | None = None

    @property
    def stderr(self) -> str:
        """What the process wrote besides its answers (logs outside invocations, prints)."""
        return "".join(self._stderr)

    async def __aenter__(self) -> FunctionsWorker:
        self._process = await asyncio.create_subprocess_exec(
            self.deployed.python,
            *("-S", "-P", str(HOST_SCRIPT)),
            *("--worker", str(self.deployed.worker), "--app", str(self.deployed.app)),
            cwd=self.deployed.app,  # the host starts its worker in the app folder
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
        )
        self._stderr_reader = asyncio.create_task(self._read_stderr())
        try:
            ready = await self._receive(self.start_timeout, "its ready line")
            if not ready["ready"]:
                raise RuntimeError(f"the worker did not start: {ready['error']}\n{self.stderr}")
        except BaseException:
            await self._kill()
            raise
        self.functions = ready["functions"]
        self.python_version = ready["python"]
        self.runtime_path = Path(ready["runtime"])
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def invoke_queue(
        self, name: str, body: str, *, dequeue_count: int = 1, message_id: str | None = None
    ) -> Invocation:
        """``name`` triggered by a queue message with ``body`` (as text, after base64 decoding);
        the message's id is a new one unless given."""
        queue = {"body": body, "dequeue_count": dequeue_count, "id": message_id}
        return await self._invoke({"invoke": name, "queue": queue})

    async def invoke_timer(self, name: str, past_due: bool = False) -> Invocation:
        return await self._invoke({"invoke": name, "timer": {"past_due": past_due}})

    async def invoke_http(
        self,
        name: str,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        body: str = "",
    ) -> Invocation:
        """``name`` triggered by ``method path`` (``/api/...``); ``params`` are the route's values.
        The host has already checked the function's key by then: no key is needed here."""
        url = f"http://127.0.0.1{path}" + (f"?{urlencode(query)}" if query else "")
        http = {
            "method": method,
            "url": url,
            "headers": dict(headers or {}),
            "query": dict(query or {}),
            "params": dict(params or {}),
            "body": body,
        }
        return await self._invoke({"invoke": name, "http": http})

    async def stop(self, timeout: float = 60) -> int:
        """Ask the worker to stop (it flushes the app's telemetry first); kill it if it won't."""
        process = self._process
        if process is None or self.returncode is not None:
            return self.returncode or 0
        try:
            if process.returncode is None:
                await self._send({"stop": True})
                await self._receive(timeout, "its stop answer")
                await asyncio.wait_for(process.wait(), timeout)
        except (OSError, RuntimeError, TimeoutError):
            await self._kill()
        await self._finish()
        assert process.returncode is not None
        self.returncode = process.returncode
        return self.returncode

    async def _invoke(self, request: dict[str, Any]) -> Invocation:
        await self._send(request)
        answer = await self._receive(self.invocation_timeout, f"an answer to {request['invoke']}")
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return Invocation.parse(answer)

    async def _send(self, request: dict[str, Any]) -> None:
        stdin = self._started().stdin
        assert stdin is not None
        stdin.write(json.dumps(request).encode() + b"\n")
        await stdin.drain()

    async def _receive(self, timeout: float, what: str) -> dict[str, Any]:
        process = self._started()
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"the worker gave no {what} in {timeout} s:\n{self.stderr}"
            ) from None
        if not line:
            await self._finish()
            raise RuntimeError(
                f"the worker exited ({process.returncode}) before {what}:\n{self.stderr}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def _read_stderr(self) -> None:
        stderr = self._started().stderr
        assert stderr is not None
        async for line in stderr:
            self._stderr.append(line.decode(errors="replace"))

    def _started(self) -> asyncio.subprocess.Process:
        assert self._process is not None, "start the worker with `async with`"
        return self._process

    async def _kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
        await self._finish()

    async def _finish(self) -> None:
        """Wait for the process to end and for its stderr to be read to the end."""
        if self._process is not None:
            await self._process.wait()
        if self._stderr_reader is not None:
            await self._stderr_reader
