"""The one place the Functions side builds the relay's settings, and the relay it shares.

The Functions host imports the app while indexing, before any invocation, so nothing is read or
opened at import: the first invocation loads ``Settings`` from the app settings once and opens the
process's relay (its pool and HTTP sessions); every later invocation reuses both. A host of our
own (``outbox serve``, ``make run``) builds the settings itself and hands them over with
``use(settings)`` before the functions run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from outbox.azure.telemetry_setup import configure
from outbox.core.settings import Settings
from outbox.relay.runtime import Relay, tune_garbage_collector


class FunctionsHost:
    """The settings and the relay of the process's functions, built on first use."""

    def __init__(self, load: Callable[[], Settings] = Settings.load) -> None:
        self._load = load
        self._settings: Settings | None = None
        self._relay: Relay | None = None
        self._lock = asyncio.Lock()

    def use(self, settings: Settings) -> None:
        """Run the functions with ``settings``, built by the host that runs them."""
        self._settings = settings

    @property
    def settings(self) -> Settings:
        """The settings given to ``use``, else those of the environment, read once."""
        if self._settings is None:
            self._settings = self._load()
        return self._settings

    async def relay(self) -> Relay:
        """The process's relay, opened on first use with ``settings``."""
        async with self._lock:
            if self._relay is not None and self._relay.loop is not asyncio.get_running_loop():
                # Only in tests: a new event loop cannot use clients bound to the old one.
                self._relay = None
            if self._relay is None:
                tune_garbage_collector()  # the worker process hosts the relay
                # Under the Functions host, which sends the logs to Application Insights itself
                # (no setting tells it on every plan: Flex deprecates FUNCTIONS_WORKER_RUNTIME).
                configure(functions_host=True)
                self._relay = await Relay.open(self.settings)
            return self._relay

    def stop(self) -> None:
        """Make the relay's running drains wrap up (graceful shutdown)."""
        if self._relay is not None:
            self._relay.processor.stop()

    async def close(self) -> None:
        """Close the relay and forget the settings (host shutdown, tests)."""
        async with self._lock:
            self._settings = None
            if self._relay is not None:
                relay, self._relay = self._relay, None
                await relay.close()


# The triggers' host: one per worker process, as the Functions runtime runs them.
functions_host = FunctionsHost()
