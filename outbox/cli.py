"""``python -m outbox``: the relay's command line (thin: each command calls the package)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

import asyncpg

from outbox.errors import InvalidMessageError, OutboxError
from outbox.migrate import migrate
from outbox.processor import DATABASE_ERRORS
from outbox.producer import enqueue
from outbox.redact import Redactor
from outbox.runtime import Relay
from outbox.settings import Settings
from outbox.wakeup import WakeUpQueue

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m outbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "migrate", help="apply pending migrations (safe to run twice, or in parallel)"
    )
    drain = commands.add_parser(
        "drain", help="deliver every due message once; print a JSON summary"
    )
    drain.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="stop leasing after this long (default: OUTBOX_RUN_BUDGET_SECONDS)",
    )
    enqueue = commands.add_parser(
        "enqueue", help="commit one event to the outbox, then send the wake-up hint"
    )
    enqueue.add_argument("event_type", help="e.g. OrderCompleted")
    enqueue.add_argument("payload", help="a JSON object, e.g. '{\"orderId\": 1}'")
    return parser


async def run_migrate(settings: Settings) -> int:
    conn = await asyncpg.connect(settings.database_url.get_secret_value())
    try:
        applied = await migrate(conn)
    finally:
        await conn.close()
    print(json.dumps({"applied": applied}))
    return EXIT_OK


async def run_drain(settings: Settings, budget: float | None) -> int:
    async with await Relay.open(settings) as relay:
        summary = await relay.processor.execute(budget)
    print(json.dumps(summary.as_dict()))
    return EXIT_FAILED if summary.error else EXIT_OK


async def run_enqueue(settings: Settings, event_type: str, payload_text: str) -> int:
    try:
        payload = json.loads(payload_text)
    except ValueError as exc:
        raise InvalidMessageError(f"payload is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidMessageError("payload must be a JSON object")
    conn = await asyncpg.connect(settings.database_url.get_secret_value())
    try:
        async with conn.transaction():
            message_id = await enqueue(
                conn, event_type, payload, max_payload_bytes=settings.max_payload_bytes
            )
    finally:
        await conn.close()
    sent = False
    if settings.has_queue:
        async with WakeUpQueue.from_settings(settings) as queue:
            sent = await queue.notify()
    print(json.dumps({"messageId": str(message_id), "hintSent": sent}))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.load()
    except OutboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.command == "migrate":
            return asyncio.run(run_migrate(settings))
        if args.command == "enqueue":
            return asyncio.run(run_enqueue(settings, args.event_type, args.payload))
        return asyncio.run(run_drain(settings, args.budget))
    except OutboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (*DATABASE_ERRORS, asyncpg.PostgresError) as exc:
        redact = Redactor.from_settings(settings)
        print(f"error: database: {redact(_describe(exc))}", file=sys.stderr)
        return EXIT_FAILED


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
