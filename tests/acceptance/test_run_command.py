"""The README's run command on a fresh machine: embedded PostgreSQL, Azurite, demo receiver and the
app's functions in one process tree; Ctrl-C stops all of it, and so does a SIGINT or SIGTERM sent
to the `make` process alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from outbox.hosting.local import claim
from tests.support import pg
from tests.support.azure import free_port
from tests.support.outbox_helpers import ROOT, eventually, run_cli, seed
from tests.support.processes import Child
from tests.support.receiver import Receiver, Reply


def processes_mentioning(text: str) -> list[str]:
    result = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True, check=False)
    return [line for line in result.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.slow
async def test_run_command_delivers_an_enqueued_event_and_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {"OUTBOX_LOCAL_DIR": str(tmp_path)}  # no database, queue or webhooks configured
    run = await Child.start("outbox.local", "--in-process", "--port", str(port), env=env)
    try:
        await run.wait_for_line(r"serving 18 functions", timeout=120)
        assert "embedded PostgreSQL" in run.output
        assert "demo receiver for OrderCompleted" in run.output
        assert (tmp_path / "run.env").exists()
        assert processes_mentioning(str(tmp_path / "pgdata"))
        assert processes_mentioning(str(tmp_path / "azurite"))

        # Another shell: the CLI finds the running relay's settings in run.env.
        enqueued = await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=env)
        assert enqueued.returncode == 0, enqueued.stderr
        output = json.loads(enqueued.stdout)
        assert output["hint_sent"] is True
        await run.wait_for_line(
            rf"received OrderCompleted {output['message_id']} \(signature valid\): "
            r'\{"orderId": 1\}'
        )

        key = (tmp_path / "function-key").read_text().strip()
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/api/outbox/drain"
            async with http.post(url, headers={"x-functions-key": key}) as response:
                assert response.status == 200
                assert (await response.json())["error"] is None
        assert key not in run.output

        assert await run.stop(signal.SIGINT) == 0
    finally:
        await run.kill()
    assert "stopped" in run.lines[-1]
    assert not (tmp_path / "run.env").exists()
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
async def test_run_command_without_azure_storage_wakes_over_postgres(
    tmp_path: Path, database_url: str
) -> None:
    port = free_port()
    env = {
        "OUTBOX_LOCAL_DIR": str(tmp_path),
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WAKEUP": "postgres",
    }
    run = await Child.start("outbox.local", "--port", str(port), env=env)
    try:
        await run.wait_for_line(r"serving 18 functions", timeout=120)
        assert "PostgreSQL NOTIFY (OUTBOX_WAKEUP=postgres), no queue" in run.output
        assert "Azurite" not in run.output
        assert not processes_mentioning(str(tmp_path / "azurite"))

        # Another shell: run.env carries OUTBOX_WAKEUP, so the commit's NOTIFY wakes the run.
        enqueued = await run_cli("enqueue", "OrderCompleted", '{"orderId": 2}', env=env)
        assert enqueued.returncode == 0, enqueued.stderr
        output = json.loads(enqueued.stdout)
        assert output["hint_sent"] is True
        await run.wait_for_line(rf"received OrderCompleted {output['message_id']} ")
        await run.wait_for_line(r"outbox\.drain trigger=notify .*processed=1")
        assert await run.stop(signal.SIGINT) == 0
    finally:
        await run.kill()


def run_command(
    folder: Path, port: int | None = None, **settings: str
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "OUTBOX_LOCAL_DIR": str(folder), **settings}
    return subprocess.run(
        [sys.executable, "-m", "outbox.local", "--in-process", "--port", str(port or free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("OUTBOX_BATCH_SIZE", "0", "invalid configuration: OUTBOX_BATCH_SIZE"),
        ("OUTBOX_QUEUE_NAME", "Bad_Name", "invalid configuration: OUTBOX_QUEUE_NAME"),
        ("AzureWebJobsStorage", "garbage", "AzureWebJobsStorage is not a valid storage connection"),
        ("OUTBOX_WEBHOOKS", "{x", "invalid configuration: OUTBOX_WEBHOOKS: is not valid JSON"),
    ],
)
async def test_run_command_stops_at_once_on_a_bad_setting(
    tmp_path: Path, setting: str, value: str, message: str
) -> None:
    # As `outbox serve` does: a bad value stops start-up, rather than every invocation failing,
    # and before anything is started (no embedded database, no Azurite).
    result = await asyncio.to_thread(run_command, tmp_path, **{setting: value})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {message}")
    assert "Traceback" not in result.stderr
    assert "outbox relay running" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]


async def test_a_second_run_command_in_the_same_folder_refuses_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    run_env = tmp_path / "run.env"
    run_env.write_text("export OUTBOX_LOCAL_PID=1\n")  # the first run's settings
    with claim(tmp_path):  # as the first run holds its folder
        result = await asyncio.to_thread(run_command, tmp_path)
    assert result.returncode == 2
    assert f"error: make run is already running with its data in {tmp_path}" in result.stderr
    assert run_env.read_text() == "export OUTBOX_LOCAL_PID=1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.env", "run.lock"]


@pytest.mark.parametrize(
    ("database", "message"),
    [
        ("unreachable", "error: database: ConnectionRefusedError: "),
        ("missing", 'error: database: InvalidCatalogNameError: database "no_such_db_'),
    ],
)
async def test_run_command_stops_with_one_line_when_the_database_cannot_be_used(
    tmp_path: Path, admin_dsn: str, database: str, message: str
) -> None:
    if database == "unreachable":
        url = f"postgresql://relay:pw-in-url@127.0.0.1:{free_port()}/x"
    else:
        url = pg.with_database(admin_dsn, f"no_such_db_{os.getpid()}")
    result = await asyncio.to_thread(run_command, tmp_path, OUTBOX_DATABASE_URL=url)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "pw-in-url" not in result.stdout + result.stderr
    assert "outbox relay running" not in result.stdout


async def test_run_command_refuses_a_port_in_use_before_saying_it_runs(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await asyncio.to_thread(run_command, tmp_path, port)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: port {port} is in use on 127.0.0.1; choose another: make run RUN_ARGS='--port N'\n"
    )
    assert "outbox relay running" not in result.stdout


@pytest.mark.parametrize("problem", ["database unreachable", "port in use"])
def test_make_run_fails_after_a_start_up_problem_with_its_one_line_error(
    tmp_path: Path, problem: str
) -> None:
    env = {"PATH": os.environ["PATH"], "OUTBOX_LOCAL_DIR": str(tmp_path)}
    with socket.socket() as taken:
        if problem == "port in use":
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            error = f"error: port {port} is in use on 127.0.0.1; choose another: make run "
        else:
            # A port of its own: `make run` may be running in another shell on the default one.
            port = free_port()
            env["OUTBOX_DATABASE_URL"] = f"postgresql://relay:pw@127.0.0.1:{free_port()}/x"
            error = "error: database: ConnectionRefusedError"
        result = subprocess.run(
            ["make", "--no-print-directory", "run", f"RUN_ARGS=--port {port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    # Before, the recipe mapped the runner's exit status 2 to success: `make run` exited 0.
    assert result.returncode == 2, result.stdout + result.stderr
    assert "outbox relay running" not in result.stdout
    # The runner's line, then make's own (the only other line).
    [line, make_says] = result.stderr.splitlines()
    assert line.startswith(error), result.stderr
    assert re.fullmatch(r"make: \*\*\* \[Makefile:\d+: run\] Error 2", make_says)


@pytest.mark.slow
async def test_ctrl_c_during_a_burst_reports_what_it_gave_back_in_one_line(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.script("/slow", then=Reply(200, delay=0.2))
    port = free_port()
    env = {
        "OUTBOX_LOCAL_DIR": str(tmp_path),
        "OUTBOX_WEBHOOKS": json.dumps({"OrderCompleted": {"url": receiver.url("/slow")}}),
        "OUTBOX_CONCURRENCY": "2",
    }
    run = await Child.start("outbox.local", "--in-process", "--port", str(port), env=env)
    try:
        await run.wait_for_line(r"serving 18 functions", timeout=120)
        await run_cli("enqueue", "OrderCompleted", '{"burst": 0}', env=env)
        url = run_env_url(tmp_path)
        conn = await asyncpg.connect(url)
        try:
            await seed(conn, 200)
        finally:
            await conn.close()
        await run_cli("enqueue", "OrderCompleted", '{"burst": 1}', env=env)  # its hint
        await receiver.wait_for(10, path="/slow", timeout=60)
        assert await run.stop(signal.SIGINT) == 0
    finally:
        await run.kill()
    # Whichever run had them: the hint's, or the five-minute sweep's if it fired meanwhile.
    summaries = [line for line in run.lines if "outbox.drain trigger=" in line]
    assert any(int(re.search(r"released=(\d+)", line)[1]) > 0 for line in summaries), run.output
    assert "outcome=Released" not in run.output


def run_env_url(folder: Path) -> str:
    words = shlex.split((folder / "run.env").read_text())
    values = dict(word.partition("=")[::2] for word in words if word != "export")
    return values["OUTBOX_DATABASE_URL"]


async def make_run(folder: Path, port: int, **settings: str) -> Child:
    """``make run`` as a user starts it, in its own folder and on its own port."""
    process = await asyncio.create_subprocess_exec(
        "make",
        "--no-print-directory",
        "run",
        f"RUN_ARGS=--in-process --port {port}",
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "OUTBOX_LOCAL_DIR": str(folder), **settings},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    return Child(process)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (Linux), at any depth."""
    children: dict[int, set[int]] = defaultdict(set)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            children[int(stat.read_text().rsplit(")", 1)[1].split()[1])].add(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        new = children[todo.pop()] - found
        found |= new
        todo += new
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def ports_in_run_env(folder: Path) -> list[int]:
    """The ports of what the run started for itself (Azurite's, the demo receiver's)."""
    words = shlex.split((folder / "run.env").read_text())
    values = dict(word.partition("=")[::2] for word in words if word != "export")
    chosen = values["AzureWebJobsStorage"] + values["OUTBOX_WEBHOOKS"]
    return sorted({int(port) for port in re.findall(r"http://127\.0\.0\.1:(\d+)/", chosen)})


def postmaster(data: Path) -> tuple[int, Path] | None:
    """The embedded PostgreSQL's pid and socket (it listens on no TCP port), once it is ready
    (not initdb's single-user backend, whose pid the file holds negated, nor one starting)."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir, status = int(lines[0]), lines[3], lines[4], lines[7].strip()
    except (OSError, ValueError, IndexError):  # not there, or not written whole yet
        return None
    if pid < 0 or status != "ready":
        return None
    return pid, Path(socket_dir) / f".s.PGSQL.{port}"


def gone(pids: set[int], ports: list[int], files: tuple[Path, ...] = ()) -> bool:
    still = [p for p in pids if alive(p)] + [p for p in ports if listening(p)]
    return not still and not any(file.exists() for file in files)


async def signal_make_alone(run: Child, signum: int) -> int:
    """``signum`` to make's pid only (not its process group, as Ctrl-C would); its exit status."""
    os.kill(run.process.pid, signum)
    return await asyncio.wait_for(run.process.wait(), 30)


def kill_left_over(pids: set[int], folder: Path) -> None:
    """What a failed test left running (before the fix: the runner, and Azurite, started before
    the signal or after it), so that it does not outlive the test."""
    mentioning = {int(line.split()[0]) for line in processes_mentioning(str(folder))}
    for pid in pids | mentioning:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_to_make_alone_stops_everything_make_run_started(
    tmp_path: Path, database_url: str, signum: int
) -> None:
    port = free_port()
    run = await make_run(tmp_path, port, OUTBOX_DATABASE_URL=database_url)
    started: set[int] = set()
    try:
        await run.wait_for_line(r"serving 18 functions", timeout=120)
        started = descendants(run.process.pid)  # the runner, Azurite (node)
        ports = [port, *ports_in_run_env(tmp_path)]  # the relay's, Azurite's three, the demo's
        assert len(ports) == 5
        assert all(map(listening, ports))
        assert processes_mentioning(str(tmp_path / "azurite"))
        # Before: SIGTERM killed the recipe's shell and left the runner and Azurite running;
        # SIGINT did nothing at all (make waits for children it did not signal).
        code = await signal_make_alone(run, signum)
        await eventually(lambda: gone(started, ports), timeout=30)
    finally:
        kill_left_over(started, tmp_path)  # first: one left running keeps make's output open
        await run.kill()
    assert code == -signum  # make ends by the signal, as make does, once everything stopped
    assert "stopped" in run.lines[-1]  # the relay's own last line: it stopped gracefully
    assert not (tmp_path / "run.env").exists()
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
async def test_sigterm_to_make_during_start_up_stops_the_embedded_postgresql_too(
    tmp_path: Path,
) -> None:
    run = await make_run(tmp_path, free_port())  # no database configured: an embedded one
    started: set[int] = set()
    try:
        # Stopped as soon as its PostgreSQL runs: before the migrations, Azurite and the functions.
        await eventually(lambda: postmaster(tmp_path / "pgdata") is not None, timeout=120)
        server = postmaster(tmp_path / "pgdata")
        assert server is not None
        started = descendants(run.process.pid) | {server[0]}
        assert alive(server[0])
        assert server[1].exists()
        code = await signal_make_alone(run, signal.SIGTERM)
        await eventually(lambda: gone(started, [], (server[1],)), timeout=60)
    finally:
        kill_left_over(started, tmp_path)  # first: one left running keeps make's output open
        await run.kill()
    assert code == -signal.SIGTERM, run.output
    assert run.lines == ["stopped before start-up finished"]  # no traceback, nothing else
    assert processes_mentioning(str(tmp_path)) == []
