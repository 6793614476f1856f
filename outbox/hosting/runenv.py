"""``.local/run.env``: the settings a running ``make run`` chose, for commands in other shells.

``make run`` writes it (readable by its user only) while it runs; ``python -m outbox …`` reads it
for every variable the environment does not set, so that ``enqueue`` or ``status`` in another
shell reach the same database and queue. It lives in ``OUTBOX_LOCAL_DIR``, by default ``.local``
in the working folder (``make run`` runs from the repository's).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

# The settings another shell needs to reach what make run started.
SHARED = (
    "OUTBOX_DATABASE_URL",
    "AzureWebJobsStorage",
    "OUTBOX_QUEUE_NAME",
    "OUTBOX_WAKEUP",
    "OUTBOX_WEBHOOKS",
)
IDENTITY_STORAGE_PREFIX = "AzureWebJobsStorage__"


def local_dir() -> Path:
    """Where ``make run`` keeps its data: ``OUTBOX_LOCAL_DIR``, or ``.local`` here."""
    return Path(os.environ.get("OUTBOX_LOCAL_DIR") or ".local").resolve()


def run_env_path() -> Path:
    return local_dir() / "run.env"


def run_env_values(
    names: Iterable[str] = SHARED, chosen: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The values of ``names`` as a run uses them (``chosen`` ones first, then the
    environment's), and identity-based storage settings from the environment."""
    chosen = chosen or {}
    values = {name: chosen.get(name) or os.environ.get(name) for name in names}
    values |= {n: v for n, v in os.environ.items() if n.startswith(IDENTITY_STORAGE_PREFIX)}
    return {name: value for name, value in values.items() if value}


def write_run_env(path: Path, values: Mapping[str, str]) -> None:
    """The settings other shells need, with this process's id (a dead run's file is ignored)."""
    lines = [f"export OUTBOX_LOCAL_PID={os.getpid()}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    write_private(path, "\n".join(lines) + "\n")


def load_run_env() -> None:
    """Take settings from a running ``make run`` for variables the environment does not set."""
    path = run_env_path()
    try:
        # One shell-quoted file: a value may span lines (pretty-printed OUTBOX_WEBHOOKS).
        words = shlex.split(path.read_text())
    except (OSError, ValueError):
        return  # none, or not one make run wrote: as if it were not running
    values = dict(word.partition("=")[::2] for word in words if word != "export")
    owner = values.pop("OUTBOX_LOCAL_PID", "")
    if not owner.isdigit() or not _alive(int(owner)):
        return  # left over from a run that did not stop cleanly
    for key, value in values.items():
        os.environ.setdefault(key, value)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only, from the first byte (it holds credentials)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    path.chmod(0o600)  # a file that existed before keeps its mode through O_CREAT


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
