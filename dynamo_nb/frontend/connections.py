"""Slow and idle clients: a header-read timeout and a cap on open connections for the frontend.

aiohttp closes a keep-alive connection idle between requests after ``keepalive_timeout`` (the
frontend's ``--http-idle-timeout``), but it waits for a request's headers as long as they
trickle in: 100 connections that each send a header byte now and then would hold 100
connections for ever (slowloris). `ConnectionGuard` sits between the listening socket and
aiohttp's protocol:

- **header timeout** (``--http-header-timeout``): a connection whose first request's headers
  are not complete (``\\r\\n\\r\\n``) within the timeout is closed;
- **connection cap** (``--http-max-connections``): a connection beyond the cap gets a 503 in
  OpenAI's envelope and is closed at once, so a flood of idle connections cannot exhaust the
  frontend's file descriptors.

Counters: ``open``, ``refused_total``, ``timed_out_total``.

Example::

    guard = ConnectionGuard(header_timeout=10, max_connections=4096)
    site = GuardedSite(runner, guard, "127.0.0.1", 8000)
    await site.start()
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .error_envelope import error_body

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionGuard",
    "GuardedSite",
]

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 60.0
DEFAULT_MAX_CONNECTIONS = 4096


class ConnectionGuard:
    """The header timeout and connection cap of one listener, with what they did.

    Attributes:
        open: connections open now.
        refused_total: connections refused at the cap.
        timed_out_total: connections closed because their headers did not come in time.
    """

    def __init__(
        self, header_timeout: float = DEFAULT_HEADER_TIMEOUT, max_connections: int = DEFAULT_MAX_CONNECTIONS
    ) -> None:
        if header_timeout <= 0:
            raise ValueError(f"the header timeout must be positive, got {header_timeout}")
        if max_connections < 1:
            raise ValueError(f"the connection cap must be at least 1, got {max_connections}")
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.open = 0
        self.refused_total = 0
        self.timed_out_total = 0

    def protocol(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory that guards each protocol ``inner()`` makes."""
        return lambda: _Guarded(inner(), self)


_REFUSED = error_body(503, "the frontend has too many open connections; retry later")


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, with the guard's checks around it."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen, for a header end split across reads
        self.counted = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.guard.open >= self.guard.max_connections:
            self.guard.refused_total += 1
            body = json.dumps(_REFUSED).encode()
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            transport.close()
            return
        self.guard.open += 1
        self.counted = True
        self.timer = asyncio.get_running_loop().call_later(self.guard.header_timeout, self._too_slow)
        self.inner.connection_made(transport)

    def _too_slow(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.timed_out_total += 1
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            if b"\r\n\r\n" in self.tail + data[:3] or b"\r\n\r\n" in data:
                self.timer.cancel()  # the first request's headers are in: aiohttp's limits take over
                self.timer = None
            else:
                self.tail = (self.tail + data)[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.counted:
            self.guard.open -= 1
            self.counted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """aiohttp's `TCPSite` whose connections pass through a `ConnectionGuard`."""

    def __init__(
        self, runner: web.BaseRunner, guard: ConnectionGuard, host: str, port: int, **kwargs: Any
    ) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.protocol(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port
