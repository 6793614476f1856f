"""``outbox.sync``: the producer for synchronous code at its documented path
(``outbox.producer.sync``)."""

from outbox.producer.sync import *  # noqa: F403
