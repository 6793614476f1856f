"""Operations: what operators do to the outbox, shared by the commands (``python -m outbox …``) and
the HTTP functions. Above the store (imports core, store, transport), below the Functions side and
the hosts, beside the relay (neither imports the other).

- ``status``: the backlog's health; ``replay``: Failed messages sent again (requeue);
  ``retention``: the purge; ``inspection``: one message (show)
- ``views``: what the operator's console shows; ``actions``: its actions, each recorded once
- ``grants``: the relay's own database role (``python -m outbox grant``)
- ``requests``, ``list_query``: what those are asked for, checked in one place
- ``sql``: their statements (``queries.sql``), run through the store's execution helpers

``from outbox import operations`` gives the day-two commands below.
"""

from outbox.operations.inspection import show
from outbox.operations.replay import RequeueReport, requeue
from outbox.operations.requests import RequeueFilter
from outbox.operations.retention import InboxPurgeReport, PurgeReport, purge, purge_inbox
from outbox.operations.status import BacklogStatus, backlog_status

__all__ = [
    "BacklogStatus",
    "InboxPurgeReport",
    "PurgeReport",
    "RequeueFilter",
    "RequeueReport",
    "backlog_status",
    "purge",
    "purge_inbox",
    "requeue",
    "show",
]
