"""The README's run command on a fresh machine: embedded PostgreSQL, Azurite, demo receiver and the
app's functions in one process tree; Ctrl-C stops all of it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from outbox.local import claim
from tests.support.azure import free_port
from tests.support.outbox_helpers import ROOT, run_cli
from tests.support.processes import Child


def processes_mentioning(text: str) -> list[str]:
    result = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True, check=False)
    return [line for line in result.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.slow
async def test_run_command_delivers_an_enqueued_event_and_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {"OUTBOX_LOCAL_DIR": str(tmp_path)}  # no database, queue or webhooks configured
    run = await Child.start("outbox.local", "--in-process", "--port", str(port), env=env)
    try:
        await run.wait_for_line(r"serving 6 functions", timeout=120)
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


def run_command(folder: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "OUTBOX_LOCAL_DIR": str(folder), **settings}
    return subprocess.run(
        [sys.executable, "-m", "outbox.local", "--in-process", "--port", str(free_port())],
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
