"""Azure Storage helpers for the tests: Azurite connection strings, ports nobody listens on."""

from __future__ import annotations

import socket

# Azurite's well-known development account (public, documented; not a secret).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(queue_port: int, blob_port: int | None = None) -> str:
    parts = [
        "DefaultEndpointsProtocol=http",
        f"AccountName={DEV_ACCOUNT}",
        f"AccountKey={DEV_KEY}",
        f"QueueEndpoint=http://127.0.0.1:{queue_port}/{DEV_ACCOUNT}",
    ]
    if blob_port is not None:
        parts.append(f"BlobEndpoint=http://127.0.0.1:{blob_port}/{DEV_ACCOUNT}")
    return ";".join(parts) + ";"


def free_port() -> int:
    """A port that nothing listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
