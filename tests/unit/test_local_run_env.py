"""``make run`` hands its settings to other shells in ``.local/run.env``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from outbox.hosting.local import function_key
from outbox.hosting.runenv import load_run_env, run_env_values, write_run_env

WEBHOOKS = json.dumps({"OrderCompleted": {"url": "http://127.0.0.1:9/x", "secret": None}}, indent=2)
NAMES = ["OUTBOX_DATABASE_URL", "AzureWebJobsStorage", "OUTBOX_QUEUE_NAME", "OUTBOX_WEBHOOKS"]


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OUTBOX_LOCAL_DIR", str(tmp_path))
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_settings_of_several_lines_come_back_as_they_were(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_WEBHOOKS", WEBHOOKS)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql://u:p w'd@localhost/db")
    write_run_env(local_dir / "run.env", run_env_values(NAMES))
    monkeypatch.delenv("OUTBOX_WEBHOOKS")
    monkeypatch.delenv("OUTBOX_DATABASE_URL")
    load_run_env()
    assert os.environ["OUTBOX_WEBHOOKS"] == WEBHOOKS
    assert os.environ["OUTBOX_DATABASE_URL"] == "postgresql://u:p w'd@localhost/db"
    assert stat.S_IMODE((local_dir / "run.env").stat().st_mode) == 0o600


def test_an_unset_setting_is_left_out_and_identity_storage_settings_are_kept(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make run with AzureWebJobsStorage__accountName: there is no AzureWebJobsStorage to write.
    monkeypatch.setenv("AzureWebJobsStorage__accountName", "myaccount")
    write_run_env(local_dir / "run.env", run_env_values(NAMES))
    monkeypatch.delenv("AzureWebJobsStorage__accountName")
    load_run_env()
    assert os.environ["AzureWebJobsStorage__accountName"] == "myaccount"  # noqa: SIM112
    assert "AzureWebJobsStorage" not in os.environ


def test_an_unreadable_file_is_ignored(local_dir: Path) -> None:
    (local_dir / "run.env").write_text("export OUTBOX_WEBHOOKS='{\n")
    load_run_env()  # no exception: as if make run were not running
    assert "OUTBOX_WEBHOOKS" not in os.environ


def test_the_function_key_file_holds_the_key_in_effect(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # make run prints "function key in .local/function-key": that must be the key that works.
    generated = function_key(local_dir)
    assert (local_dir / "function-key").read_text() == generated
    monkeypatch.setenv("OUTBOX_FUNCTION_KEY", "key-from-the-environment")
    assert function_key(local_dir) == "key-from-the-environment"
    assert (local_dir / "function-key").read_text() == "key-from-the-environment"
    assert stat.S_IMODE((local_dir / "function-key").stat().st_mode) == 0o600
