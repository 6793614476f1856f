"""``python -m outbox`` run as a user runs it: a subprocess with settings in the environment."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from typing import Any

from tests.conftest import SECRET
from tests.support import pg
from tests.support.outbox_helpers import ROOT, peek_hints, row, run_cli, seed, statuses
from tests.support.receiver import Receiver


async def test_migrate_command_is_idempotent(admin_dsn: str) -> None:
    name = pg.unique_name("outbox_cli")
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    env = {"OUTBOX_DATABASE_URL": pg.with_database(admin_dsn, name)}
    try:
        first = await run_cli("migrate", env=env)
        second = await run_cli("migrate", env=env)
    finally:
        await pg.drop(admin_dsn, name)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["applied"][0].startswith("0001_")
    assert (second.returncode, json.loads(second.stdout)) == (0, {"applied": []})


async def test_drain_command_prints_one_json_summary(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    await seed(db, 3)
    webhooks = {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
    result = await run_cli(
        "drain", env={"OUTBOX_DATABASE_URL": database_url, "OUTBOX_WEBHOOKS": json.dumps(webhooks)}
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["leased"], summary["processed"], summary["failed"]) == (3, 3, 0)
    assert summary["stopped_by"] == "drained"
    assert isinstance(summary["duration_seconds"], float)
    assert len(receiver.requests) == 3
    assert await statuses(db) == {"Processed": 3}


async def test_bad_settings_exit_2_naming_the_setting_without_the_secret() -> None:
    secret = "whsec_bm90LWEtdmFsaWQtc2VjcmV0!!"
    webhooks = {"A": {"url": "https://example.com/h", "secret": secret}}
    result = await run_cli(
        "drain",
        env={
            "OUTBOX_DATABASE_URL": "postgresql://u:pw-in-url@127.0.0.1/x",
            "OUTBOX_WEBHOOKS": json.dumps(webhooks),
            "OUTBOX_BATCH_SIZE": "-1",
        },
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "OUTBOX_WEBHOOKS['A'].secret" in result.stderr
    assert "OUTBOX_BATCH_SIZE" in result.stderr
    assert "bm90LWEtdmFsaWQtc2VjcmV0" not in result.stderr
    assert "pw-in-url" not in result.stderr
    assert "Traceback" not in result.stderr


async def test_unreachable_database_is_a_clean_error() -> None:
    from tests.support.azure import free_port

    env = {"OUTBOX_DATABASE_URL": f"postgresql://relay:pw-in-url@127.0.0.1:{free_port()}/x"}
    drain = await run_cli("drain", env=env)
    migrate = await run_cli("migrate", env=env)
    assert drain.returncode == 1
    summary = json.loads(drain.stdout)
    assert summary["stopped_by"] == "error"
    assert summary["error"].startswith("database error: ConnectionRefusedError")
    assert migrate.returncode == 1
    assert "error: database: ConnectionRefusedError" in migrate.stderr
    for result in (drain, migrate):
        assert "pw-in-url" not in result.stdout + result.stderr
        assert "Traceback" not in result.stderr


async def test_enqueue_command_commits_the_event_and_sends_a_hint(
    db: Any, database_url: str, queue_settings: Any
) -> None:
    result = await run_cli(
        "enqueue",
        "OrderCompleted",
        '{"orderId": 7}',
        env={
            "OUTBOX_DATABASE_URL": database_url,
            "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
            "OUTBOX_QUEUE_NAME": queue_settings.queue_name,
        },
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["hint_sent"] is True
    stored = await db.fetchrow("SELECT * FROM outbox_messages")
    assert str(stored["outbox_message_id"]) == output["message_id"]
    assert (stored["event_type"], stored["status"]) == ("OrderCompleted", "Pending")
    assert json.loads(stored["payload"]) == {"orderId": 7}
    assert len(await peek_hints(queue_settings)) == 1


async def test_enqueue_command_refuses_a_payload_that_is_not_an_object(
    db: Any, database_url: str
) -> None:
    # A bad argument: exit 2, as the CLI documents for bad settings or arguments.
    result = await run_cli("enqueue", "X", "[1]", env={"OUTBOX_DATABASE_URL": database_url})
    assert result.returncode == 2
    assert "error: payload must be a JSON object" in result.stderr
    nested = await run_cli("enqueue", "X", "[" * 40_000, env={"OUTBOX_DATABASE_URL": database_url})
    assert nested.returncode == 2
    assert "error: payload is not valid JSON" in nested.stderr
    assert "Traceback" not in nested.stderr
    assert await db.fetchval("SELECT count(*) FROM outbox_messages") == 0


async def test_enqueue_command_reports_the_committed_event_even_when_the_queue_is_misconfigured(
    db: Any, database_url: str
) -> None:
    # The event is committed before the hint: a bad queue setting must not hide its id.
    env = {"OUTBOX_DATABASE_URL": database_url, "AzureWebJobsStorage": "AccountKey=k3y;garbage"}
    result = await run_cli("enqueue", "OrderCompleted", '{"orderId": 3}', env=env)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["hint_sent"] is False
    assert await db.fetchval("SELECT count(*) FROM outbox_messages") == 1
    assert str(await db.fetchval("SELECT outbox_message_id FROM outbox_messages")) == str(
        output["message_id"]
    )
    assert "Traceback" not in result.stderr
    assert "k3y" not in result.stderr


async def test_a_configuration_error_found_late_exits_2(database_url: str, tmp_path: Any) -> None:
    result = await run_cli(
        "serve",
        "--host-json",
        str(tmp_path / "missing.json"),
        env={"OUTBOX_DATABASE_URL": database_url},
    )
    assert result.returncode == 2
    assert "error: host.json: cannot read" in result.stderr


async def test_serve_refuses_a_port_out_of_range_in_one_error_line(database_url: str) -> None:
    for port in ("99999", "65536", "0", "-1", "http"):
        result = await run_cli("serve", "--port", port, env={"OUTBOX_DATABASE_URL": database_url})
        assert result.returncode == 2, (port, result.stderr)
        errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
        assert errors == [
            "python -m outbox serve: error: argument --port: must be a whole number from 1 to 65535"
        ], port
        assert "Traceback" not in result.stderr


async def test_drain_command_refuses_a_budget_that_is_not_a_positive_number(
    db: Any, database_url: str
) -> None:
    await seed(db)
    for budget in ("nan", "inf", "-1", "0", "soon"):
        result = await run_cli(
            "drain", "--budget", budget, env={"OUTBOX_DATABASE_URL": database_url}
        )
        assert result.returncode == 2, budget
        assert (
            "argument --budget: must be a finite number of seconds greater than 0" in result.stderr
        )
    assert await statuses(db) == {"Pending": 1}


async def test_requeue_command_refuses_a_naive_time_beside_an_aware_one(
    db: Any, database_url: str
) -> None:
    result = await run_cli(
        "requeue",
        "--created-from",
        "2026-01-01T00:00:00",
        "--created-to",
        "2026-01-02T00:00:00Z",
        env={"OUTBOX_DATABASE_URL": database_url},
    )
    assert result.returncode == 2
    assert "error: times need a UTC offset" in result.stderr
    assert "Traceback" not in result.stderr


async def test_requeue_errors_name_the_command_s_flags(db: Any, database_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": database_url}
    backwards = await run_cli(
        "requeue",
        "--created-from",
        "2026-02-01T00:00:00Z",
        "--created-to",
        "2026-01-01T00:00:00Z",
        env=env,
    )
    assert backwards.returncode == 2
    assert "error: --created-from must be earlier than --created-to" in backwards.stderr
    both = await run_cli("requeue", "--event-type", "X", "--all-failed", env=env)
    assert both.returncode == 2
    assert (
        "say which Failed messages to requeue: --id, --event-type, --endpoint, --error and/or "
        "--created-from/--created-to, or --all-failed (but not both)" in both.stderr
    )


async def test_migrate_takes_a_max_lock_wait_in_seconds(database_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": database_url}
    done = await run_cli("migrate", "--max-lock-wait", "5", env=env)
    assert (done.returncode, json.loads(done.stdout)) == (0, {"applied": []}), done.stderr
    bad = await run_cli("migrate", "--max-lock-wait", "nan", env=env)
    assert bad.returncode == 2
    assert "--max-lock-wait: must be a finite number of seconds, 0 or more" in bad.stderr


async def run_on_terminal(*args: str, env: dict[str, str], answer: str) -> tuple[int, str, str]:
    """``python -m outbox`` with a terminal for its stdin, answering ``answer`` when asked."""

    def run() -> tuple[int, str, str]:
        controller, terminal = pty.openpty()
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "outbox", *args],
                cwd=ROOT,
                env={"PATH": os.environ["PATH"], **env},
                stdin=terminal,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            os.write(controller, answer.encode() + b"\n")
            out, err = child.communicate(timeout=120)
        finally:
            os.close(controller)
            os.close(terminal)
        return child.returncode, out, err

    return await asyncio.to_thread(run)


async def failed_messages(db: Any, count: int) -> list[Any]:
    ids = await seed(db, count)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', last_error = 'HTTP 500' "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids,
    )
    return ids


async def test_a_bulk_requeue_asks_on_a_terminal_and_a_script_must_say_yes(
    db: Any, database_url: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": database_url}
    await failed_messages(db, 3)
    scripted = await run_cli("requeue", "--all-failed", env=env)
    assert scripted.returncode == 2
    assert "error: a requeue by filter asks for confirmation on a terminal: pass --yes" in (
        scripted.stderr
    )
    code, out, err = await run_on_terminal("requeue", "--all-failed", env=env, answer="n")
    assert (code, out) == (1, "")
    assert "requeue 3 Failed message(s), sent again to: OrderCompleted. Go ahead? [y/N]" in err
    assert "error: not confirmed: nothing was changed" in err
    assert await statuses(db) == {"Failed": 3}
    code, out, err = await run_on_terminal("requeue", "--all-failed", env=env, answer="y")
    assert (code, json.loads(out)["requeued"]) == (0, 3), err
    assert await statuses(db) == {"Pending": 3}
    dry = await run_cli("requeue", "--all-failed", "--dry-run", env=env)  # a plan asks nothing
    assert dry.returncode == 0, dry.stderr


async def test_cancel_replay_and_probe_commands_and_unknown_ids_or_endpoints_exit_1(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
    }
    pending, delivered = await seed(db, 2)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processed', processed_at = now() "
        "WHERE outbox_message_id = $1",
        delivered,
    )
    unasked = await run_cli("cancel", str(pending), "--reason", "dup", env=env)
    assert unasked.returncode == 2
    cancelled = await run_cli(
        "cancel", str(pending), str(delivered), "--reason", "duplicate order", "--yes", env=env
    )
    assert cancelled.returncode == 0, cancelled.stderr
    result = json.loads(cancelled.stdout)
    assert (result["cancelled"], result["skipped"]) == ([str(pending)], [str(delivered)])
    assert (await row(db, pending))["last_error"] == "cancelled by cli: duplicate order"
    window = ["--created-from", "2000-01-01T00:00:00Z", "--created-to", "2100-01-01T00:00:00Z"]
    plan = await run_cli("replay", *window, "--dry-run", env=env)
    assert json.loads(plan.stdout)["would_resend"] == 1, plan.stderr
    replayed = await run_cli("replay", *window, "--yes", env=env)
    assert json.loads(replayed.stdout)["resent"] == 1, replayed.stderr
    assert (await row(db, delivered))["status"] == "Pending"
    no_window = await run_cli("replay", "--yes", env=env)
    assert no_window.returncode == 2
    assert "--created-from and --created-to are required" in no_window.stderr
    closed = await run_cli("probe", "OrderCompleted", env=env)
    assert (closed.returncode, "has no open breaker" in closed.stderr) == (1, True)
    unknown = "7d4f2f5e-6b38-4a44-9a9e-6f7b1c9d2e11"
    for args in (
        ("show", unknown),
        ("requeue", "--id", unknown),
        ("resend", unknown),
        ("cancel", unknown, "--reason", "x", "--yes"),
    ):
        missing = await run_cli(*args, env=env)
        assert (missing.returncode, missing.stderr) == (1, f"error: no outbox message {unknown}\n")
    nowhere = await run_cli("pause", "NoSuchType", env=env)
    assert (nowhere.returncode, nowhere.stderr) == (
        1,
        "error: no endpoint of event type 'NoSuchType' (configured: OrderCompleted)\n",
    )
    resumed = await run_cli("resume", "OrderCompleted", "nowhere", env=env)
    assert resumed.returncode == 1
    bad_cursor = await run_cli("list", "--after", f"0001-01-01T00:00:00+14:00_{unknown}", env=env)
    assert (bad_cursor.returncode, bad_cursor.stderr) == (
        2,
        "error: --after must be the cursor a previous page gave\n",
    )
