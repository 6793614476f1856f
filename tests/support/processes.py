"""Child processes whose output the tests watch line by line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """A ``python -m …`` child with stdout and stderr merged and collected as lines."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls,
        *args: str,
        env: dict[str, str],
        python: str = sys.executable,
        cwd: Path = ROOT,
        preexec_fn: Callable[[], None] | None = None,
    ) -> Child:
        """``preexec_fn``: run in the child before it starts (to lower its limits, say)."""
        process = await asyncio.create_subprocess_exec(
            python,
            "-m",
            *args,
            cwd=cwd,
            env={"PATH": os.environ["PATH"], **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=preexec_fn,  # only setrlimit: safe before exec
        )
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def wait_for_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """The first output line matching ``pattern``; fails with the output so far."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if match := regex.search(line):
                    return match
            if self.process.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"no line matching {pattern!r}:\n{self.output}")
            await asyncio.sleep(0.05)

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.returncode is None:
            self.process.send_signal(signum)
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await self._reader
        return code

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        await self._reader
