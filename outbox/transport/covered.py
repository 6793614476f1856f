"""Hints a drain has made redundant, deleted after it.

A hint says "rows committed before I was sent may be waiting"; a drain that began after it was
sent, and ended caught up, took those rows. Left in the queue, each such hint is one more
invocation that finds nothing, and the queue's length is what Flex Consumption scales the queue
trigger's instances on: one hint per commit at a steady 100 msg/s grew the queue by dozens a
second under one instance (docs/performance.md, "Latency under steady load").

So after such a drain the relay looks at the queue's oldest hints (a peek: no message is hidden
or counted as dequeued by looking) and deletes those sent more than ``COVERED_MARGIN_SECONDS``
before the drain began (the storage service's clock against the host's: a host clock ahead of
the service's by more than that could delete a hint the drain did not cover, whose rows the
timer's sweep then delivers). A hint counts from the latest time it carries: when the queue took
it, when it was last refreshed (``requestedAt``: a producer updates its waiting hint rather than
send another, ``outbox.transport.wakeup``), when it asked to wake a run (``wakeAt``, delayed).
What the queue trigger holds at the time is invisible here and left to it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from datetime import datetime

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue.aio import QueueClient

# How far before a drain's start a hint must have been sent for the drain to cover it.
COVERED_MARGIN_SECONDS = 5.0
# Messages a peek or a receive returns at most (the service's limit), and peeks per clearing.
BATCH = 32
MAX_BATCHES = 4


def hint_time(content: str | None, inserted: datetime | None) -> float | None:
    """When a hint asks a drain to have run by (unix seconds): the latest of when the queue took
    it, its ``requestedAt`` (a hint refreshed in place keeps its insertion time) and its
    ``wakeAt``; None if none is known. ``content`` is the stored (base64) text; a field that is
    not an aware ISO 8601 time is passed over."""
    times = [inserted.timestamp()] if inserted is not None else []
    try:
        data = json.loads(base64.b64decode(content or "", validate=True))
    except (ValueError, binascii.Error):  # not one of ours: when the queue took it decides
        data = None
    for name in ("requestedAt", "wakeAt"):
        value = data.get(name) if isinstance(data, dict) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                moment = datetime.fromisoformat(value)
                if moment.tzinfo is not None:
                    times.append(moment.timestamp())
    return max(times, default=None)


def is_covered(content: str | None, inserted: datetime | None, drained_from: float) -> bool:
    sent = hint_time(content, inserted)
    return sent is not None and sent < drained_from - COVERED_MARGIN_SECONDS


async def clear_covered(client: QueueClient, drained_from: float) -> int:
    """Delete the hints a drain that began at ``drained_from`` (unix seconds) covered; how many.

    ``client`` sends and receives text as stored (no base64 policy: a message that is not one
    of ours must not stop the clearing).
    """
    cleared = 0
    for _ in range(MAX_BATCHES):
        try:
            peeked = await client.peek_messages(max_messages=BATCH)
        except ResourceNotFoundError:  # no queue yet: nothing to clear
            return cleared
        wanted = 0
        for message in peeked:  # oldest first; stop at the first the drain did not cover
            if not is_covered(message.content, message.inserted_on, drained_from):
                break
            wanted += 1
        if wanted == 0:
            return cleared
        received = [
            m
            async for m in client.receive_messages(
                messages_per_page=wanted, max_messages=wanted, visibility_timeout=30
            )
        ]
        covered = [m for m in received if is_covered(m.content, m.inserted_on, drained_from)]
        newer = [m for m in received if m not in covered]  # the queue's order is not strict
        await asyncio.gather(
            *(client.delete_message(m) for m in covered),
            *(client.update_message(m, visibility_timeout=0) for m in newer),
        )
        cleared += len(covered)
        if wanted < len(peeked) or len(peeked) < BATCH or newer:
            return cleared
    return cleared
