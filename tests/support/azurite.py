"""Azurite (the Azure Storage emulator, from npm) started on free ports for the tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.azure import connection_string, free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "tools" / "node_modules" / ".bin"


class Azurite:
    """One Azurite process (queue service only, or the full emulator), its data in a temporary
    folder removed at ``stop()``.

    Not in memory (``--inMemoryPersistence``): that store keeps each message written as an extent
    of its own, and its garbage collection, every 60 s, walks them all on Node's one thread. At
    100 hints a second the queue then stopped answering from about 60 s after start, for 5 s and
    more (every request of a 90 s probe timed out after its 60th second). On disk, 100 s at the
    same rate answered every request within 40 ms (docs/benchmarks/journal, 2026-12-07).
    """

    def __init__(self, *, full: bool = False, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key: Azurite then speaks HTTPS and checks OAuth
        tokens (``--oauth basic``: their audience, issuer and lifetime, not their signature)."""
        self.full = full
        self.tls = tls
        self.queue_port = free_port()
        self.blob_port = free_port() if full else None
        self.process: subprocess.Popen[bytes] | None = None
        self.location: Path | None = None

    @property
    def queue_service_uri(self) -> str:
        """The queue service, as an identity-based connection names it (path-style account)."""
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.queue_port}/devstoreaccount1"

    @property
    def connection_string(self) -> str:
        return connection_string(self.queue_port, self.blob_port)

    def start(self, timeout: float = 30) -> Azurite:
        executable = BIN / ("azurite" if self.full else "azurite-queue")
        if not executable.exists():
            raise RuntimeError(f"{executable} not found: install Azurite with `make test`")
        self.location = Path(tempfile.mkdtemp(prefix="azurite-"))
        args = [
            str(executable),
            "--location",
            str(self.location),
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
            "--queueHost",
            "127.0.0.1",
            "--queuePort",
            str(self.queue_port),
        ]
        if self.tls is not None:
            cert, key = self.tls
            args += ["--oauth", "basic", "--cert", str(cert), "--key", str(key)]
        if self.full:
            args += [
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.blob_port),
                "--tableHost",
                "127.0.0.1",
                "--tablePort",
                str(free_port()),
            ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            self._wait_until_listening(timeout)
        except BaseException:
            self.stop()  # and its folder with it
            raise
        return self

    def _wait_until_listening(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Azurite exited: {self.process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", self.queue_port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"Azurite did not listen on port {self.queue_port} within {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.location is not None:
            shutil.rmtree(self.location, ignore_errors=True)
            self.location = None
