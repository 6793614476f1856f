"""``python -m outbox``: the relay's command line (thin: each command calls the package).

Every command prints one JSON object on stdout. Exit status: 0 ok, 1 failed (or, for ``status``,
unhealthy; an unknown message id or endpoint; an action not confirmed), 2 bad settings or
arguments. Bulk actions (``requeue`` by filter, ``resend`` of several ids, ``cancel``,
``replay``) print their plan and ask for confirmation on a terminal; without one they need
``--yes``. ``migrate --inbox`` and ``purge --inbox`` serve a consumer's database: they read
``OUTBOX_DATABASE_URL`` and no other setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from outbox import operations
from outbox.azure import telemetry_setup
from outbox.core.errors import (
    BadRequestError,
    ConfigurationError,
    DatabaseError,
    InvalidMessageError,
    OutboxError,
)
from outbox.core.models import Status
from outbox.core.redact import Redactor
from outbox.core.settings import DatabaseSettings, Settings
from outbox.core.text import escape_controls
from outbox.hosting.runenv import load_run_env
from outbox.hosting.terminal import configure_cli, configure_console, help_text, message_table
from outbox.operations import actions, grants, replay_window, requests, views
from outbox.operations.list_query import (
    DEFAULT_PAGE_SIZE,
    MESSAGE_FLAGS,
    MESSAGE_PARAMETERS,
    parse_message_query,
)
from outbox.producer.core import enqueue
from outbox.relay.runtime import Relay
from outbox.store import entra, partitions
from outbox.store.connection import connect, database_boundary
from outbox.store.migrate import (
    DEFAULT_MAX_LOCK_WAIT_SECONDS,
    LOCK_TIMEOUT_SECONDS,
    migrate,
    migrate_inbox,
)
from outbox.store.postgres import PostgresStore
from outbox.transport.wakeup import notify_once

T = TypeVar("T")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
# Who acted, in the console's record of actions, when a command did.
CLI_ACTOR = "cli"
YES_HELP = "do it without asking (scripts: a bulk action needs it without a terminal)"


class NotConfirmed(OutboxError):
    """The operator answered no to a bulk action's plan: nothing was changed."""


def add_console_commands(commands: Any) -> None:
    """``list``, ``endpoints``, ``pause``, ``resume``: the operator's console's, on the command
    line (the same operations as its HTTP API, recorded as its actions are)."""
    listing = commands.add_parser("list", help="messages matching filters, newest first")
    listing.add_argument("--status", choices=[str(s) for s in Status])
    listing.add_argument("--event-type")
    listing.add_argument("--endpoint")
    listing.add_argument("--ordering-key")
    listing.add_argument("--created-from", metavar="ISO8601")
    listing.add_argument("--created-to", metavar="ISO8601")
    listing.add_argument("--error", help="text in last_error")
    listing.add_argument("--after", help="the cursor a previous page printed")
    listing.add_argument("--limit", help=f"rows (default {DEFAULT_PAGE_SIZE})")
    listing.add_argument("--json", action="store_true", help="one JSON object, with the cursor")
    commands.add_parser("endpoints", help="each endpoint: its breaker, whether it is paused")
    resend = commands.add_parser("resend", help="send Processed messages again (same webhook-id)")
    resend.add_argument("message_ids", nargs="+", type=uuid.UUID, metavar="ID")
    resend.add_argument("--endpoint", help="to this endpoint alone (default: every endpoint)")
    resend.add_argument("--yes", action="store_true", help=YES_HELP)
    cancel = commands.add_parser("cancel", help="make Pending messages Failed, saying why")
    cancel.add_argument("message_ids", nargs="+", type=uuid.UUID, metavar="ID")
    cancel.add_argument("--reason", required=True, help="why (kept in each one's last_error)")
    cancel.add_argument("--yes", action="store_true", help=YES_HELP)
    replay = commands.add_parser(
        "replay", help="send a window's Processed messages again (same webhook-ids)"
    )
    replay.add_argument("--created-from", type=datetime.fromisoformat, metavar="ISO8601")
    replay.add_argument("--created-to", type=datetime.fromisoformat, metavar="ISO8601")
    replay.add_argument("--event-type")
    replay.add_argument("--endpoint", help="to this endpoint alone (default: every endpoint)")
    replay.add_argument("--dry-run", action="store_true", help="report, change nothing")
    replay.add_argument("--action-id", help="the id of a replay to go on with, once interrupted")
    replay.add_argument("--yes", action="store_true", help=YES_HELP)
    probe = commands.add_parser(
        "probe", help="an endpoint's open breaker probed now, its waiting messages due now"
    )
    probe.add_argument("event_type")
    probe.add_argument(
        "endpoint", nargs="?", help="its name (not needed when it has only one endpoint)"
    )
    for name, what in [("pause", "its deliveries wait"), ("resume", "its deliveries go again")]:
        command = commands.add_parser(name, help=f"an endpoint of an event type: {what}")
        command.add_argument("event_type")
        command.add_argument(
            "endpoint", nargs="?", help="its name (not needed when it has only one endpoint)"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m outbox",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate_cmd = commands.add_parser(
        "migrate", help="apply pending migrations (safe to run twice, or in parallel)"
    )
    migrate_cmd.add_argument(
        "--inbox",
        action="store_true",
        help="the consumer inbox's (outbox_inbox) instead of the relay's",
    )
    migrate_cmd.add_argument(
        "--max-lock-wait",
        type=non_negative_seconds,
        default=DEFAULT_MAX_LOCK_WAIT_SECONDS,
        metavar="SECONDS",
        help=(
            "give up when a migration has waited this long in all for locks other sessions "
            f"hold (default {DEFAULT_MAX_LOCK_WAIT_SECONDS:g}); it tries again every few seconds, "
            f"holding producers back at most {LOCK_TIMEOUT_SECONDS:g} s each time"
        ),
    )
    layout = migrate_cmd.add_mutually_exclusive_group()
    layout.add_argument(
        "--partitioned",
        action="store_true",
        help=(
            "convert outbox_messages and outbox_attempts to tables partitioned by time, whose "
            "retention drops partitions (docs/partitioning.md); resumable"
        ),
    )
    layout.add_argument(
        "--plain",
        action="store_true",
        help="convert the partitioned layout back to plain tables; resumable",
    )
    migrate_cmd.add_argument(
        "--partition-interval",
        choices=tuple(partitions.INTERVALS),
        help=(
            "with --partitioned: one partition per UTC day (daily, the default) or hour "
            "(hourly: for retentions of hours; with days of retention the relay's database "
            "CPU per message grows several-fold, docs/partitioning.md)"
        ),
    )
    grant_cmd = commands.add_parser(
        "grant",
        help="make the relay's own database role where missing and grant it what it needs",
        description=(
            "Run by the role that migrated (the tables' owner), after migrate. On Azure Database "
            "for PostgreSQL with Microsoft Entra sign-in, the role is the app identity's, made "
            "with pgaadauth_create_principal(_with_oid); elsewhere CREATE ROLE … LOGIN. "
            "Idempotent: run it again after any change."
        ),
    )
    grant_cmd.add_argument(
        "role", help="the role the relay signs in as (on Azure: its identity's name)"
    )
    grant_cmd.add_argument(
        "--entra-object-id",
        metavar="ID",
        help="the Microsoft Entra principal's object id (a managed identity's principal id)",
    )
    grant_cmd.add_argument(
        "--entra-type",
        choices=grants.ENTRA_TYPES,
        default="service",
        help="with --entra-object-id: the principal's kind (service: a managed identity or app)",
    )
    grant_cmd.add_argument(
        "--no-default-privileges",
        action="store_true",
        help="grant on today's tables only (then run grant again after each migrate)",
    )
    drain = commands.add_parser("drain", help="deliver every due message once")
    drain.add_argument(
        "--budget",
        type=positive_seconds,
        metavar="SECONDS",
        help="lease and send nothing new after this long",
    )
    enqueue_cmd = commands.add_parser(
        "enqueue", help="commit one event, then send the wake-up hint"
    )
    enqueue_cmd.add_argument("event_type", help="e.g. OrderCompleted")
    enqueue_cmd.add_argument("payload", help="a JSON object, e.g. '{\"orderId\": 1}'")
    enqueue_cmd.add_argument("--ordering-key", help="deliver in order with others of this key")
    commands.add_parser("status", help="backlog health; exits 1 when unhealthy")
    requeue = commands.add_parser("requeue", help="set Failed messages back to Pending")
    requeue.add_argument("--id", dest="ids", action="append", type=uuid.UUID, metavar="UUID")
    requeue.add_argument("--event-type")
    requeue.add_argument("--endpoint", help="the Failed messages of this endpoint, for it alone")
    requeue.add_argument("--created-from", type=datetime.fromisoformat, metavar="ISO8601")
    requeue.add_argument("--created-to", type=datetime.fromisoformat, metavar="ISO8601")
    requeue.add_argument("--error", help="those whose last_error holds this text")
    requeue.add_argument("--all-failed", action="store_true", help="every Failed message")
    requeue.add_argument("--dry-run", action="store_true", help="report, change nothing")
    requeue.add_argument("--yes", action="store_true", help=YES_HELP)
    add_console_commands(commands)
    purge = commands.add_parser(
        "purge", help="delete Processed (and old Failed) rows past retention"
    )
    purge.add_argument(
        "--inbox", action="store_true", help="delete old consumer inbox rows instead"
    )
    purge.add_argument(
        "--older-than-days",
        type=positive_days,
        metavar="N",
        help="with --inbox: delete rows received more than N days ago",
    )
    show = commands.add_parser("show", help="one message with its attempt history")
    show.add_argument("message_id", type=uuid.UUID)
    serve_cmd = commands.add_parser(
        "serve", help="run the relay's Azure Functions without the Functions host"
    )
    serve_cmd.add_argument("--host", default="127.0.0.1", help="HTTP address (127.0.0.1)")
    serve_cmd.add_argument("--port", type=tcp_port, default=7071, help="HTTP port (7071)")
    serve_cmd.add_argument(
        "--host-json",
        type=Path,
        metavar="PATH",
        help="host settings (default: ./host.json if there is one, else the package's)",
    )
    serve_cmd.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="host this FunctionApp or Blueprint instead of the relay's own functions",
    )
    serve_cmd.add_argument(
        "--max-connections",
        type=connection_count,
        metavar="N",
        help="open HTTP connections at most (default: a quarter of the descriptor limit, "
        "at most 1024)",
    )
    serve_cmd.add_argument(
        "--uvloop",
        action="store_true",
        help="run on uvloop, a faster event loop (the [uvloop] extra; not on Windows)",
    )
    return parser


def positive_seconds(text: str) -> float:
    """``--budget`` seconds: nan would never end a run, and 0 or less would drain nothing."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError("must be a finite number of seconds greater than 0")
    return seconds


def non_negative_seconds(text: str) -> float:
    """``--max-lock-wait`` seconds: 0 tries each migration once."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError("must be a finite number of seconds, 0 or more")
    return seconds


def tcp_port(text: str) -> int:
    """``serve --port``: a TCP port the server can bind (not 0: a port nobody would know)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 65535")
    return port


def positive_days(text: str) -> int:
    """``--older-than-days``: a whole number of days, at least 1 (0 would empty the inbox)."""
    try:
        days = int(text)
    except ValueError:
        days = 0
    if not 1 <= days <= 36500:
        raise argparse.ArgumentTypeError("must be a whole number of days from 1 to 36500")
    return days


def connection_count(text: str) -> int:
    """``serve --max-connections``: a whole number from 1 to 65536."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 65536:
        raise argparse.ArgumentTypeError("must be a whole number of connections from 1 to 65536")
    return count


def bulk(args: argparse.Namespace) -> str | None:
    """What bulk action ``args`` ask for, one a terminal confirms (None: not one)."""
    if getattr(args, "dry_run", False) or getattr(args, "yes", True):
        return None
    if args.command == "requeue":
        given = [args.event_type, args.endpoint, args.created_from, args.created_to, args.error]
        by_filter = args.all_failed or any(value is not None for value in given)
        return "a requeue by filter" if by_filter else None
    if args.command == "resend" and len(args.message_ids) > 1:
        return "a resend of several messages"
    return {"cancel": "a cancel", "replay": "a replay"}.get(args.command)


def confirmable(args: argparse.Namespace) -> None:
    """A ``BadRequestError`` when ``args`` ask for a bulk action with no terminal to confirm it
    on and no ``--yes``: checked once the rest of the arguments are, before anything is done."""
    action = bulk(args)
    if action is not None and not sys.stdin.isatty():
        raise BadRequestError(
            f"{action} asks for confirmation on a terminal: pass --yes to do it without"
        )


def flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of flags that argparse cannot check on its own."""
    if args.command == "migrate" and args.inbox and (args.partitioned or args.plain):
        return "--partitioned and --plain are the relay's tables' layouts, not the inbox's"
    if args.command == "migrate" and args.partition_interval and not args.partitioned:
        return "--partition-interval applies to migrate --partitioned only"
    if args.command != "purge":
        return None
    if args.inbox and args.older_than_days is None:
        return "purge --inbox needs --older-than-days N: how long inbox rows are kept"
    if not args.inbox and args.older_than_days is not None:
        return (
            "--older-than-days applies to purge --inbox only; the outbox's own rows are kept "
            "for OUTBOX_RETENTION_DAYS"
        )
    return None


def emit(data: Any) -> None:
    print(json.dumps(data, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


async def run_migrate(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    report: dict[str, Any] = {"applied": await migrate(conn, max_lock_wait=args.max_lock_wait)}
    if args.partitioned:
        report.update(
            await partitions.convert(
                conn,
                interval=args.partition_interval or partitions.DEFAULT_INTERVAL,
                max_lock_wait=args.max_lock_wait,
            )
        )
    elif args.plain:
        report.update(await partitions.convert_back(conn, max_lock_wait=args.max_lock_wait))
    emit(report)
    return EXIT_OK


async def run_drain(settings: Settings, args: argparse.Namespace) -> int:
    telemetry_setup.configure()  # the SDK the environment asks for, before the relay opens
    async with await Relay.open(settings) as relay:
        summary = await relay.drain(args.budget)
    emit(summary.as_dict())
    return EXIT_FAILED if summary.error else EXIT_OK


async def run_enqueue(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except (ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"payload is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidMessageError("payload must be a JSON object")
    async with conn.transaction():
        message_id = await enqueue(
            conn,
            args.event_type,
            payload,
            ordering_key=args.ordering_key,
            max_payload_bytes=settings.max_payload_bytes,
        )
    # Committed: from here on nothing may fail the command, or its id would be lost to the
    # caller (notify() logs a bad queue setting and returns False, as for any lost hint).
    sent = await wake(conn, settings)
    emit({"message_id": message_id, "hint_sent": sent})
    return EXIT_OK


async def run_status(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    status = await operations.backlog_status(
        conn, settings.alert_oldest_pending_seconds, notify_wakeups=settings.wakes_by_postgres
    )
    emit(status.as_dict())
    return EXIT_OK if status.healthy else EXIT_FAILED


async def run_requeue(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    given = {
        "message_ids": tuple(args.ids) if args.ids else None,
        "event_type": args.event_type,
        "created_from": args.created_from,
        "created_to": args.created_to,
        "all_failed": args.all_failed,
        "endpoint": args.endpoint,
        "error": args.error,
        "dry_run": args.dry_run,
    }
    # Checked here to word its errors by the command's flags; requeue checks it again.
    wanted = requests.parse(requests.RequeueRequest, given, names=requests.FLAG_NAMES)
    confirmable(args)
    if bulk(args):
        plan = await actions.requeue(conn, wanted.filter, dry_run=True, actor=CLI_ACTOR)
        where = ", ".join(plan["endpoints"] or [])
        confirm(f"requeue {plan['requeued']} Failed message(s), sent again to: {where}")
    report = await actions.requeue(conn, wanted.filter, dry_run=wanted.dry_run, actor=CLI_ACTOR)
    if report["requeued"] and not wanted.dry_run:
        await wake(conn, settings)  # a drain takes them at once, not at the next sweep
    emit(report)
    return EXIT_OK


async def run_list(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    given = {name: getattr(args, name) for name in MESSAGE_PARAMETERS}
    wanted = parse_message_query(given, MESSAGE_FLAGS)
    page = await views.list_messages(conn, wanted, settings.endpoint_names)
    if args.json:
        emit(page)
    else:
        searched = page["scan_limit"] if page["scan_limited"] else None
        print(message_table(page["messages"], page["next"], searched))
    return EXIT_OK


async def run_endpoints(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    emit({"endpoints": await views.endpoint_health(conn, settings.endpoint_names)})
    return EXIT_OK


async def run_resend(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    given = (conn, args.message_ids, args.endpoint, settings.endpoint_names)
    confirmable(args)
    if bulk(args):
        plan = await actions.resend(*given, actor=CLI_ACTOR, dry_run=True)
        to = f"to {args.endpoint}" if args.endpoint else "to every endpoint of its event type"
        confirm(f"resend {len(plan['would_resend'])} Processed message(s) {to}", plan)
    result = await actions.resend(*given, actor=CLI_ACTOR)
    if result["resent"]:
        await wake(conn, settings)
    emit(result)
    return EXIT_OK


async def run_cancel(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    reason = requests.cancel_reason(args.reason, "--reason")
    hold = settings.ordering_on_failure == "hold"
    given = (conn, args.message_ids, reason)
    confirmable(args)
    if bulk(args):
        plan = await actions.cancel(*given, actor=CLI_ACTOR, dry_run=True, hold_on_failure=hold)
        confirm(f"cancel {len(plan['would_cancel'])} Pending message(s): {reason}", plan)
    result = await actions.cancel(*given, actor=CLI_ACTOR, hold_on_failure=hold)
    if result["released"]:
        await wake(conn, settings)
    emit(result)
    return EXIT_OK


async def run_replay(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    given = {
        "event_type": args.event_type,
        "endpoint": args.endpoint,
        "created_from": args.created_from,
        "created_to": args.created_to,
        "dry_run": args.dry_run,
        "action_id": args.action_id,
    }
    wanted = requests.parse(requests.ReplayRequest, given, names=requests.FLAG_NAMES)
    endpoints = settings.endpoint_names
    confirmable(args)
    if bulk(args) and args.action_id is None:
        plan = await replay_window.plan(conn, wanted, endpoints)
        confirm(
            f"replay {plan['would_resend']} Processed message(s) created from "
            f"{wanted.created_from} to {wanted.created_to}, sent again to: "
            f"{', '.join(plan['endpoints'])}",
            plan,
        )
    result = await replay_window.replay(conn, wanted, endpoints, actor=CLI_ACTOR)
    if result.get("in_progress"):
        raise OutboxError(f"replay {result['action_id']!r} is running in another call")
    if not wanted.dry_run and result["resent"] and not result["repeated"]:
        await wake(conn, settings)
    emit(result)
    return EXIT_OK


async def run_probe(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    key = requests.key_of(settings.endpoint_names, args.event_type, args.endpoint)
    result = await actions.probe(conn, key, actor=CLI_ACTOR)
    await wake(conn, settings)  # the probe is the next delivery there
    emit(result)
    return EXIT_OK


def confirm(plan: str, details: dict[str, Any] | None = None) -> None:
    """Ask on the terminal whether to go ahead with ``plan`` (``flag_problem`` has made sure
    there is one); ``NotConfirmed`` unless the answer is yes. What it skips is listed first."""
    for message_id, why in ((details or {}).get("why_skipped") or {}).items():
        print(f"skipped {message_id}: {escape_controls(why)}", file=sys.stderr)
    print(f"{escape_controls(plan)}. Go ahead? [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise NotConfirmed("not confirmed: nothing was changed")


async def run_pause(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    key = requests.key_of(settings.endpoint_names, args.event_type, args.endpoint)
    emit(await actions.pause(conn, key, actor=CLI_ACTOR))
    return EXIT_OK


async def run_resume(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    key = requests.key_of(settings.endpoint_names, args.event_type, args.endpoint)
    result = await actions.resume(conn, key, actor=CLI_ACTOR)
    if result["due"]:
        await wake(conn, settings)  # what waited is drained at once
    emit(result)
    return EXIT_OK


async def wake(conn: Any, settings: Settings) -> bool:
    """One wake-up after a commit, over the configured transport: whether one was sent."""
    if settings.wakes_by_postgres:
        return await PostgresStore(conn).notify_wakeup()
    return await notify_once(settings) if settings.has_queue else False


async def run_purge(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    report = await operations.purge(
        conn,
        retention_days=settings.retention_days,
        failed_retention_days=settings.failed_retention_days,
        batch_size=settings.purge_batch_size,
    )
    emit(report.as_dict())
    return EXIT_OK


async def run_show(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    message = await operations.show(conn, args.message_id)
    if message is None:
        raise OutboxError(f"no outbox message {args.message_id}")
    emit(message)
    return EXIT_OK


async def run_grant(conn: Any, settings: Settings, args: argparse.Namespace) -> int:
    url = settings.database_url.get_secret_value()

    async def other_database(name: str) -> Any:
        return await connect(
            urlunsplit(urlsplit(url)._replace(path=f"/{name}")),
            password=entra.for_settings(settings),
        )

    report = await grants.grant(
        conn,
        args.role,
        other_database=other_database,
        entra_object_id=args.entra_object_id,
        entra_type=args.entra_type,
        default_privileges=not args.no_default_privileges,
    )
    emit(report.as_dict())
    return EXIT_OK


ConnectionCommand = Callable[[Any, Settings, argparse.Namespace], Awaitable[int]]
CONNECTION_COMMANDS: dict[str, ConnectionCommand] = {
    "migrate": run_migrate,
    "grant": run_grant,
    "enqueue": run_enqueue,
    "status": run_status,
    "requeue": run_requeue,
    "purge": run_purge,
    "show": run_show,
    "list": run_list,
    "endpoints": run_endpoints,
    "resend": run_resend,
    "cancel": run_cancel,
    "replay": run_replay,
    "probe": run_probe,
    "pause": run_pause,
    "resume": run_resume,
}


async def run_migrate_inbox(conn: Any, args: argparse.Namespace) -> int:
    emit({"applied": await migrate_inbox(conn, max_lock_wait=args.max_lock_wait)})
    return EXIT_OK


async def run_purge_inbox(conn: Any, args: argparse.Namespace) -> int:
    report = await operations.purge_inbox(conn, older_than_days=args.older_than_days)
    emit(report.as_dict())
    return EXIT_OK


InboxCommand = Callable[[Any, argparse.Namespace], Awaitable[int]]
INBOX_COMMANDS: dict[str, InboxCommand] = {
    "migrate": run_migrate_inbox,
    "purge": run_purge_inbox,
}


async def run_serve(settings: Settings, args: argparse.Namespace) -> int:
    # Only this command needs the self-host (and its web server): imported for it alone.
    from outbox.hosting import serve  # noqa: PLC0415

    key = settings.function_key.get_secret_value() if settings.function_key else None
    view = settings.console_view_key
    options = serve.ServeOptions(
        args.host,
        args.port,
        args.host_json,
        key,
        args.app,
        args.max_connections,
        view.get_secret_value() if view else None,
        serve.named_keys(settings),
    )
    await serve.main(options, settings)
    return EXIT_OK


async def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.command == "drain":
        return await run_drain(settings, args)
    if args.command == "serve":
        return await run_serve(settings, args)
    conn = await connect(
        settings.database_url.get_secret_value(), password=entra.for_settings(settings)
    )
    try:
        # enqueue's transaction is the caller's own, outside the store's boundary: this one
        # keeps its driver errors from reaching the user as a traceback.
        command = database_boundary(CONNECTION_COMMANDS[args.command])
        return await command(conn, settings, args)
    finally:
        await conn.close()


async def run_inbox(settings: DatabaseSettings, args: argparse.Namespace) -> int:
    conn = await connect(
        settings.database_url.get_secret_value(), password=entra.for_settings(settings)
    )
    try:
        return await database_boundary(INBOX_COMMANDS[args.command])(conn, args)
    finally:
        await conn.close()


def redactor(settings: Settings | DatabaseSettings) -> Redactor:
    """Hides every secret of ``settings`` (of a consumer's, the database URL and its password)."""
    if isinstance(settings, Settings):
        return Redactor.from_settings(settings)
    url = settings.database_url.get_secret_value()
    return Redactor([url, urlsplit(url).password or ""])


def run_on_loop(command: Callable[[], Coroutine[Any, Any, T]], *, uvloop: bool) -> T:
    """Run ``command`` on asyncio's own event loop, or on uvloop's (``serve --uvloop``): the
    same relay with less CPU per message (measured in docs/performance.md)."""
    if not uvloop:
        return asyncio.run(command())
    try:
        import uvloop as fast  # noqa: PLC0415 - an extra, imported only when asked for
    except ImportError:
        raise ConfigurationError(
            'serve --uvloop needs uvloop: pip install "outbox-relay[uvloop]"'
        ) from None
    return fast.run(command())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        configure_console()
    else:
        configure_cli()
    load_run_env()
    inbox = bool(getattr(args, "inbox", False))
    settings: Settings | DatabaseSettings
    try:
        problem = flag_problem(args)
        if problem:
            raise BadRequestError(problem)
        settings = DatabaseSettings.load() if inbox else Settings.load()
    except OutboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if isinstance(settings, Settings):
            relay_settings = settings
            fast = args.command == "serve" and args.uvloop
            return run_on_loop(lambda: run(relay_settings, args), uvloop=fast)
        return asyncio.run(run_inbox(settings, args))
    except (BadRequestError, InvalidMessageError, ConfigurationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DatabaseError as exc:
        print(f"error: database: {redactor(settings)(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    except OutboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
