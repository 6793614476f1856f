"""``outbox.inbox``: the consumer's inbox at its documented path (``outbox.producer.inbox``)."""

from outbox.producer.inbox import *  # noqa: F403
