"""``outbox.telemetry.configure`` and the relay's telemetry at their documented path
(``outbox.core.telemetry``)."""

from outbox.core.telemetry import *  # noqa: F403
