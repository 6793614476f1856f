"""Which delivery errors are the relay's own (never the endpoint's), and the throttled log that
reports errors which can come thousands of times a second."""

from __future__ import annotations

import errno
import logging
import os
import socket

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from outbox.core.logs import Throttled
from outbox.transport.publisher import own_error

KEY = ConnectionKey("receiver.example", 443, True, True, None, None, None, None)


def connect_error(cause: OSError) -> aiohttp.ClientConnectorError:
    """As aiohttp raises it: the socket's error wrapped, and chained."""
    error_class = (
        aiohttp.ClientConnectorDNSError
        if isinstance(cause, socket.gaierror)
        else aiohttp.ClientConnectorError
    )
    try:
        raise error_class(KEY, cause) from cause
    except aiohttp.ClientConnectorError as raised:
        return raised


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS])
def test_the_relay_out_of_descriptors_memory_or_buffers_is_its_own_error(code: int) -> None:
    bare = OSError(code, os.strerror(code))
    for error in (bare, connect_error(bare)):
        why = own_error(error)
        assert why is not None
        assert errno.errorcode[code] in why


@pytest.mark.parametrize("code", [socket.EAI_AGAIN, socket.EAI_MEMORY])
def test_its_own_resolver_failing_is_its_own_error(code: int) -> None:
    why = own_error(connect_error(socket.gaierror(code, "resolver down")))
    assert why == "its resolver failed (resolver down)"


def test_memory_error_is_its_own_error() -> None:
    assert own_error(MemoryError()) == "out of memory (MemoryError)"


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ECONNREFUSED, "refused"),
        OSError(errno.ECONNRESET, "reset"),
        OSError(errno.EHOSTUNREACH, "unreachable"),
        OSError("no errno at all"),
        TimeoutError(),
        aiohttp.ServerDisconnectedError(),
    ],
)
def test_what_the_receiver_or_the_network_did_is_not_the_relays_own(error: Exception) -> None:
    assert own_error(error) is None
    if isinstance(error, OSError) and isinstance(error.errno, int):
        assert own_error(connect_error(error)) is None


def test_no_such_host_is_the_endpoints_url_not_the_relays_resolver() -> None:
    assert own_error(connect_error(socket.gaierror(socket.EAI_NONAME, "unknown host"))) is None


def test_a_throttled_line_is_said_once_per_interval_with_the_count_it_left_unsaid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    say = Throttled(logging.getLogger("test.throttled"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.throttled"):
        said = []
        for tick in range(7200):  # 7,200 errors over 36 s
            now[0] = tick * 0.005
            said.append(say("cannot accept\nforged line"))
    assert sum(said) == 4  # at 0 s, 10 s, 20 s and 30 s
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "cannot accept\\x0aforged line"
    assert lines[1] == "cannot accept\\x0aforged line (and 1999 more in the last 10s)"
    assert len(lines) == 4
