"""``outbox.errors``: every error class at its documented path (``outbox.core.errors``)."""

from outbox.core.errors import *  # noqa: F403
