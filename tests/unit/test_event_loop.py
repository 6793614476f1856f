"""``serve --uvloop``: the command on uvloop's event loop, or a clear error without the extra."""

from __future__ import annotations

import asyncio
import sys

import pytest

from outbox.core.errors import ConfigurationError
from outbox.hosting.cli import run_on_loop


async def loop_module() -> int:
    return int(type(asyncio.get_running_loop()).__module__.startswith("uvloop"))


def test_the_command_runs_on_uvloop_when_asked_and_on_asyncio_otherwise() -> None:
    assert run_on_loop(loop_module, uvloop=True) == 1
    assert run_on_loop(loop_module, uvloop=False) == 0


def test_uvloop_asked_for_but_not_installed_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(ConfigurationError, match=r'pip install "outbox-relay\[uvloop\]"'):
        run_on_loop(loop_module, uvloop=True)
