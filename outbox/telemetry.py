"""``outbox.telemetry.configure`` and the relay's telemetry at their documented path: the API side
(``outbox.core.telemetry``) and the SDK's set-up (``outbox.azure.telemetry_setup``)."""

from outbox.azure.telemetry_setup import *  # noqa: F403
from outbox.core.telemetry import *  # noqa: F403
