"""The built wheel in a fresh venv, from an empty folder: it migrates a fresh database and serves
the relay's functions, with nothing of this checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outbox.store.migrate import discover
from tests.support.installed import check


@pytest.mark.slow
async def test_the_installed_wheel_migrates_and_serves_from_an_empty_folder(
    tmp_path: Path, admin_dsn: str
) -> None:
    result = await check(tmp_path, admin_dsn)
    code, stdout, stderr = result["migrate"]
    assert code == 0, stderr
    assert json.loads(stdout)["applied"] == [m.name for m in discover()]
    status, content_type, body = result["status"]
    assert (status, content_type, body["healthy"]) == (200, "application/json", True)
    # Its host.json is the package's copy (the folder has none); a route it lacks is JSON too.
    assert result["missing"] == (
        404,
        "application/json",
        {"error": "no such route: GET /api/nowhere"},
    )
    assert result["stopped"] == 0, result["output"]
    assert "Traceback" not in result["output"]
