"""Hosting and tooling: ``python -m outbox`` (``cli``), the self-hosted server (``serve``), the
local runner and demo receiver, console output. The top layer: may import every other."""
