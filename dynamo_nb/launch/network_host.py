"""`NetworkHost`: what `launch` and `LocalServices` use of a host other than this machine's own
network, so that they run programs in one without importing the lab that makes hosts
(`dynamo_nb.testing.hosts.Host`, a network namespace, is one).

Example::

    network = await HostNetwork.start(["a", "b"])      # dynamo_nb.testing.hosts (root)
    worker = await launch("components/hf_worker.py", host=network.hosts["a"])
"""

from __future__ import annotations

import asyncio
import socket
from typing import Protocol

__all__ = ["NetworkHost"]


class NetworkHost(Protocol):
    """A host programs can run in: its name and address, a command wrapped to run there, and a
    socket or a connection opened from there (readiness probes)."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    def wrap(self, command: list[str]) -> list[str]: ...

    def socket(self) -> socket.socket: ...

    async def open_connection(
        self, address: str, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...
