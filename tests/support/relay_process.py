"""Relays as real operating-system processes: ``python -m outbox drain`` with settings in the env.

The tests run them with ``asyncio.create_subprocess_exec`` so the receiver in the test's own event
loop keeps answering while they work, and so they can be killed (SIGKILL) or frozen (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def relay_env(database_url: str, webhooks: dict[str, Any], **settings: Any) -> dict[str, str]:
    """The environment a relay process gets: only what it needs, nothing from the test's shell.

    ``settings`` are field names (``batch_size=10``) turned into ``OUTBOX_BATCH_SIZE=10``.
    """
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONUNBUFFERED": "1",
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(webhooks),
    }
    env.update({f"OUTBOX_{name.upper()}": str(value) for name, value in settings.items()})
    return env


@dataclass
class RelayResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        """The JSON summary ``drain`` prints as its last line."""
        lines = self.stdout.strip().splitlines()
        assert lines, f"no summary printed; stderr: {self.stderr[-2000:]}"
        summary: dict[str, Any] = json.loads(lines[-1])
        return summary


class RelayProcess:
    """One ``python -m outbox <args>`` child (default ``drain``) with its output captured."""

    def __init__(self, env: dict[str, str], *args: str, module: str = "outbox") -> None:
        self.env = env
        self.args = args or ("drain",)
        self.module = module
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> RelayProcess:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            *self.args,
            cwd=ROOT,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def send(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait(self, timeout: float = 120) -> RelayResult:
        """Wait for the process to end; fail (and kill it) if it runs longer than ``timeout``."""
        assert self.process is not None
        try:
            stdout, stderr = await asyncio.wait_for(self.process.communicate(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(f"relay process still running after {timeout}s") from None
        except asyncio.CancelledError:
            # The test gave up on it: no orphan left running, no transport left to the collector.
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            raise
        return RelayResult(
            self.process.returncode or 0,
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace"),
        )

    async def kill(self) -> RelayResult:
        """SIGKILL: no clean-up, no final writes, exactly like a crashed host."""
        self.send(signal.SIGKILL)
        return await self.wait()


async def run_relay(
    env: dict[str, str], *args: str, module: str = "outbox", timeout: float = 120
) -> RelayResult:
    """Run one relay process to completion."""
    relay = await RelayProcess(env, *args, module=module).start()
    return await relay.wait(timeout)
