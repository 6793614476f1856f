"""pgqueuer as a running service: ``python -m bench.pgq_listen``, until SIGTERM.

    python -m bench.pgq_listen --database-url … --url … [--batch-size 100] [--max-tasks 200]
        [--log-aggregation-seconds 30]

One ``QueueManager`` in its continuous mode: it LISTENs on its channel, and the trigger its
installer puts on its table NOTIFYs at each enqueue's commit, so each wakes a dequeue (its
default 30 s ``dequeue_timeout`` is only the fallback). Its entrypoint POSTs the job's payload,
signed as the relay signs a webhook (Standard Webhooks headers, the job id as ``webhook-id``),
as ``bench.worker pgqueuer`` does for the throughput section, over a session with as many
connections as it may run jobs at once. Its log rows are folded into its statistics every
``--log-aggregation-seconds`` (pgqueuer's default, 30; 0: only when asked). Prints ``ready``
before its first dequeue, and a JSON object with its failures when stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from datetime import timedelta
from typing import Any

import asyncpg

from bench.common import SECRET
from bench.worker import PGQ_ENTRYPOINT, plain_session, post
from outbox.core.settings import decode_secret
from outbox.core.signing import Signer
from outbox.transport.publisher import build_headers


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn = await asyncpg.connect(args.database_url)
    session = plain_session(args.max_tasks)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    signer = Signer([decode_secret(SECRET)])
    failures: list[str] = []
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)

    @qm.entrypoint(PGQ_ENTRYPOINT)
    async def webhook(job: Job) -> None:
        assert job.payload is not None
        headers = build_headers(signer, str(job.id), job.payload)
        try:
            await post(session, args.url, headers, job.payload)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            raise

    print("ready", flush=True)
    try:
        await qm.run(
            batch_size=args.batch_size,
            mode=QueueExecutionMode.continuous,
            max_concurrent_tasks=args.max_tasks,
            log_aggregation_interval=timedelta(seconds=args.log_aggregation_seconds),
        )
    finally:
        await session.close()
        await conn.close()
    return {"failures": len(failures), "first_failure": failures[0] if failures else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pgq_listen")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--url", required=True, help="where to POST")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--max-tasks", type=int, default=200)
    parser.add_argument("--log-aggregation-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    json.dump(asyncio.run(run(args)), sys.stdout)
    print(flush=True)


if __name__ == "__main__":
    main()
