"""The Dockerfile's recipe, run as it is written: no image can be built here (no Docker engine), so
its build stage's and its final stage's commands run in a fresh environment with the image's
Python version, then its CMD serves and its HEALTHCHECK is asked, then SIGTERM stops it.

What stands in for the image: a temporary folder for each COPY, a new venv of that Python for its
interpreter, the test's PostgreSQL for the database, and a free port for 7071. The commands are
read from the Dockerfile, so a change to them is what this test runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from tests.support import pg
from tests.support.azure import free_port
from tests.support.deployment import deployed_python

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(instruction, its arguments) in order, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    split: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            split.append([])
        split[-1].append(instruction)
    return split


def image_python() -> str:
    [image] = {args.split()[0] for word, args in instructions() if word == "FROM"}
    assert re.fullmatch(r"python:3\.13-slim", image), image  # the Python deployed_python() is
    return deployed_python()


def environment(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in stage:
        if word == "ENV":
            env |= dict(pair.split("=", 1) for pair in shlex.split(args))
    return env


def exec_form(args: str) -> list[str]:
    """A CMD's or HEALTHCHECK's JSON (exec) form."""
    command: list[str] = json.loads(args[args.index("[") :])
    return command


def test_the_image_runs_as_a_user_with_no_privileges_and_says_how_it_stops() -> None:
    final = stages()[-1]
    [user] = [args for word, args in final if word == "USER"]
    assert user.isdigit()
    assert int(user) >= 10000
    assert ("STOPSIGNAL", "SIGTERM") in final
    assert environment(final)["OUTBOX_WAKEUP"] == "postgres"


async def test_the_recipe_builds_installs_serves_is_healthy_and_stops_on_sigterm(
    tmp_path: Path, admin_dsn: str
) -> None:
    python = image_python()
    build, final = stages()
    # The build stage: its COPYs, then its RUN (pip wheel), with /wheels a folder of the test's.
    source, wheels = tmp_path / "src", tmp_path / "wheels"
    for word, args in build:
        if word == "COPY":
            *names, _ = args.split()
            for name in names:
                target = source / name.rstrip("/")
                if (ROOT / name).is_dir():
                    shutil.copytree(
                        ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / name, target)
    [wheel_run] = [args for word, args in build if word == "RUN"]
    venv = tmp_path / "image"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    image_env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    run_in = [("RUN", wheel_run, source)] + [
        ("RUN", args, tmp_path) for word, args in final if word == "RUN" and "useradd" not in args
    ]
    for _, command, cwd in run_in:
        done = subprocess.run(
            ["sh", "-c", command.replace("/wheels", str(wheels))],
            cwd=cwd,
            env=image_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert not wheels.exists()  # the final stage removes what it installed from

    name = pg.unique_name("outbox_container")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    port = str(free_port())
    env = {
        **image_env,
        **environment(final),
        "OUTBOX_DATABASE_URL": pg.with_database(admin_dsn, name),
    }
    try:
        migrated = subprocess.run(
            ["python", "-m", "outbox", "migrate"],
            env=env,
            cwd=tmp_path,  # the image's, not this checkout
            capture_output=True,
            text=True,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr
        [cmd] = [exec_form(args) for word, args in final if word == "CMD"]
        [health] = [exec_form(args) for word, args in final if word == "HEALTHCHECK"]
        served = subprocess.Popen(
            [part.replace("7071", port) for part in cmd],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert await healthy([part.replace("7071", port) for part in health], env)
            served.send_signal(signal.SIGTERM)
            output, _ = await asyncio.to_thread(served.communicate, timeout=60)
        finally:
            if served.poll() is None:
                served.kill()
        assert served.returncode == 0, output
        assert "serving 18 functions" in output
    finally:
        await pg.drop(admin_dsn, name)


async def healthy(command: list[str], env: dict[str, str], timeout: float = 60) -> bool:
    """The HEALTHCHECK's command, asked until it succeeds (the image's start period)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        done = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, check=False
        )
        if done.returncode == 0:
            return True
        await asyncio.sleep(0.2)
    return False
