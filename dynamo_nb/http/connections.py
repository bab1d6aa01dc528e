"""Slow and idle clients: the limits of the frontend's connections, and what they did.

Without limits, 100 connections that each send a header byte now and then would hold 100
connections for ever (slowloris). An `HttpServer` (`dynamo_nb.http.http_server`)
applies a `ConnectionGuard`:

- **header timeout** (``--http-header-timeout``): a connection whose first request's head
  is not complete (``\\r\\n\\r\\n``) within the timeout is closed;
- **connection cap** (``--http-max-connections``): a connection beyond the cap gets a 503 in
  OpenAI's envelope and is closed at once, so a flood of idle connections cannot exhaust the
  frontend's file descriptors.

(The idle timeout between requests, ``--http-idle-timeout``, is the server's.)
Counters: ``open``, ``refused_total``, ``timed_out_total``.

Example::

    guard = ConnectionGuard(header_timeout=10, max_connections=4096)
    server = HttpServer(routes, guard, idle_timeout=60)
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "ConnectionGuard",
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
