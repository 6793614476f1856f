"""The relay as a service installs it: the built wheel in a fresh venv, run from an empty folder.

    python -m tests.support.installed      (what .ci/run runs; the test suite calls the same)

Builds the wheel as pip does, installs it with its dependencies into a new venv, and from an empty
folder (no checkout, no host.json): ``python -m outbox migrate`` on a fresh database, then
``python -m outbox serve`` (its wake-up queue on an Azurite) until its status endpoint answers,
then SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from tests.support import pg
from tests.support.azure import free_port
from tests.support.azurite import Azurite
from tests.support.processes import ROOT, Child

SOURCES = ("outbox", "migrations", "pyproject.toml", "requirements.txt", "README.md")
KEY = "installed-package-function-key"


def build_wheel(folder: Path) -> Path:
    """The wheel, built from a copy of the sources (a build writes into its source folder)."""
    source = folder / "source"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    dist = folder / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dist),
        str(source),
        cwd=folder,
    )
    [wheel] = dist.glob("outbox_relay-*.whl")
    return wheel


def install(wheel: Path, folder: Path) -> str:
    """A new venv with ``wheel`` and its dependencies; returns its python."""
    venv = folder / "venv"
    _run(sys.executable, "-m", "venv", str(venv), cwd=folder)
    python = str(venv / "bin" / "python")
    _run(python, "-m", "pip", "install", "-q", str(wheel), cwd=folder)
    return python


async def migrate_and_serve(
    python: str, folder: Path, database_url: str, storage: str
) -> dict[str, Any]:
    """From ``folder``: migrate, serve (its wake-up queue on ``storage``), ask the status
    endpoint, stop. What each step gave."""
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_FUNCTION_KEY": KEY,
        "AzureWebJobsStorage": storage,
    }
    migrated = subprocess.run(
        [python, "-m", "outbox", "migrate"],
        cwd=folder,
        env=env | _path(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    port = free_port()
    served = await Child.start(
        "outbox", "serve", "--port", str(port), env=env, python=python, cwd=folder
    )
    try:
        await served.wait_for_line(r"serving 18 functions", timeout=60)
        base = f"http://127.0.0.1:{port}/api"
        async with aiohttp.ClientSession() as http:
            status = await _get(http, f"{base}/outbox/status", {"x-functions-key": KEY})
            missing = await _get(http, f"{base}/nowhere", {})
        stopped = await served.stop()
    finally:
        await served.kill()
    return {
        "migrate": (migrated.returncode, migrated.stdout, migrated.stderr),
        "status": status,
        "missing": missing,
        "stopped": stopped,
        "output": served.output,
    }


async def _get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    async with http.get(url, headers=headers) as response:
        return response.status, response.content_type, await response.json(content_type=None)


def _path() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin"}


def _run(*args: str, cwd: Path) -> None:
    done = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])}… failed:\n{done.stdout}\n{done.stderr}")


async def check(folder: Path, admin: str) -> dict[str, Any]:
    """The whole check in ``folder``, on a fresh database of the server ``admin`` reaches."""
    python = install(build_wheel(folder), folder)
    empty = folder / "empty"
    empty.mkdir()
    name = pg.unique_name("outbox_installed")
    await pg.admin_execute(admin, f'CREATE DATABASE "{name}"')
    azurite = Azurite().start()
    try:
        url = pg.with_database(admin, name)
        return await migrate_and_serve(python, empty, url, azurite.connection_string)
    finally:
        azurite.stop()
        await pg.drop(admin, name)


def main() -> int:
    admin = pg.admin_dsn()
    with tempfile.TemporaryDirectory(prefix="outbox-installed-") as scratch:
        result = asyncio.run(check(Path(scratch), admin))
    code, stdout, stderr = result["migrate"]
    applied = json.loads(stdout)["applied"] if code == 0 else None
    ok = bool(applied) and result["status"][0] == 200 and result["stopped"] == 0
    print(
        f"installed wheel: migrate {applied or stderr.strip()}; serve status "
        f"{result['status'][0]}; stopped {result['stopped']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
