"""The transport: how a message and a hint leave the process (the webhook POST, the wake-up hint
to the queue, its synchronous twin). Imports only ``outbox.core``."""
