"""``outbox.functions.bp``: the relay's Blueprint at its documented path
(``outbox.azure.functions``)."""

from outbox.azure.functions import *  # noqa: F403
