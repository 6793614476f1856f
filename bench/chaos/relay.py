"""The relay under test: ``python -m outbox serve`` as a child that dies with the adapter.

The harness's ``kill-worker`` and ``repeated-kill`` phases SIGKILL the process it started, and
only that process. A child relay would outlive them and go on delivering, and the phase would kill
nothing that matters; so the child asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux), exactly as if the kill had reached it too. It runs in a
session of its own, so that a Ctrl-C in a terminal reaches the adapter, which stops it in order.

Its output goes to ``relay-<instance>-<pid>.log`` beside the ledgers: the harness reads the
adapter's stdout as telemetry, and the relay's log lines (a drain summary per wake-up) are kept
for reading afterwards rather than mixed into the harness's log. If the relay exits on its own,
it is started again (after a second) and counted: the adapter must not exit on its own, or the
harness aborts the whole run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
RESTART_SECONDS = 1.0
READY_SECONDS = 30.0


def die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the parent dies (or has died already)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Relay:
    """One ``outbox serve`` process at a time, started again if it exits before ``stop``."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.restarts = 0
        self.port = 0
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def supervise(self) -> None:
        while not self._stopping:
            try:
                code = await self._run_once()
            except OSError as exc:  # could not start it (out of processes, descriptors)
                code = f"not started: {exc}"
            if not self._stopping:
                self.restarts += 1
                logger.error("relay exited (%s); starting it again (%s)", code, self.log_path)
                await asyncio.sleep(RESTART_SECONDS)

    async def _run_once(self) -> int:
        """Start ``outbox serve`` and wait for it to exit."""
        parent = os.getpid()
        self.port = free_port()
        with self.log_path.open("ab") as output:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "outbox", "serve", "--port", str(self.port)),
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=lambda: die_with_parent(parent),
                start_new_session=True,
            )
        if self._stopping:  # stop() came while it was starting
            self._process.terminate()
        return await self._process.wait()

    async def ready(self) -> None:
        """Returns once ``/readyz`` answers 200 (the database answers, the schema is current),
        or after ``READY_SECONDS`` (logged)."""
        deadline = time.monotonic() + READY_SECONDS
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"http://127.0.0.1:{self.port}/readyz") as answer:
                        if answer.status == 200:
                            return
                await asyncio.sleep(0.2)
        logger.warning(
            "relay not ready after %s s; going on (see %s)", READY_SECONDS, self.log_path
        )

    async def stop(self, grace: float) -> None:
        """SIGTERM (in-flight deliveries finish, the rest is released), SIGKILL after ``grace``
        seconds."""
        self._stopping = True
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
