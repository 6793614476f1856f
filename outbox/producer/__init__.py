"""The producer: ``enqueue`` inside the caller's transaction, ``notify`` after its commit
(``core``), the drivers it accepts (``drivers``), the synchronous façade (``sync``) and the
consumer's inbox (``inbox``). Imports the core, the store and the transport; never the relay
or the hosts.
"""

from outbox.producer.core import enqueue, notify, transaction

__all__ = ["enqueue", "notify", "transaction"]
