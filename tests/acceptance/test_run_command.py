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
from typing import Any

import aiohttp
import pytest

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


async def test_run_command_stops_at_once_on_a_bad_setting(
    tmp_path: Path, database_url: str, queue_settings: Any
) -> None:
    # As `outbox serve` does: a bad value stops start-up, rather than every invocation failing.
    env = {
        "PATH": os.environ["PATH"],
        "OUTBOX_LOCAL_DIR": str(tmp_path),
        "OUTBOX_DATABASE_URL": database_url,
        "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
        "OUTBOX_BATCH_SIZE": "0",
    }
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "outbox.local", "--in-process", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid configuration: OUTBOX_BATCH_SIZE" in result.stderr
    assert "outbox relay running" not in result.stdout
    assert not (tmp_path / "run.env").exists()
