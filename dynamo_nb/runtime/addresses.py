"""Where a listener listens and which address it advertises: one rule for every server of a
component (the TCP request plane, the bootstrap server, the frontend's URL).

- **Listen**: the host given (``--tcp-host``, ``--bootstrap-host``…); by default loopback when
  discovery and NATS are on this machine (memory, ``file://``, a loopback etcd/NATS URL), else
  the address of this machine's interface that reaches them (as Dynamo detects
  ``DYN_TCP_RPC_HOST``) — so a worker whose etcd runs on another host is reachable from there
  with no flag at all.
- **Advertise** (what goes into discovery, a READY line, ``bootstrap_info``): the host given
  (``--tcp-advertise-host``…); by default the listen host, or — when that is a wildcard
  (``0.0.0.0``, ``::``) — the address that reaches discovery (loopback when it is local), of
  the wildcard's family (a socket on ``::`` takes IPv6 only). A wildcard is never advertised:
  nobody can connect to it.

The address that reaches discovery is looked up once per process (`AddressRule.resolve`, off
the event loop: a host name may need DNS).

Example:
    >>> rule = AddressRule.toward(["etcd://127.0.0.1:2379", None])
    >>> rule.listen(None), rule.advertise("0.0.0.0")
    ('127.0.0.1', '127.0.0.1')
    >>> rule.advertise("0.0.0.0", "10.0.0.5")
    '10.0.0.5'
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = [
    "LOOPBACK",
    "AddressRule",
    "free_port",
    "host_port",
    "is_loopback",
    "is_wildcard",
    "route_source",
    "service_hosts",
]

logger = logging.getLogger("dynamo_nb.addresses")

LOOPBACK = "127.0.0.1"
_LOOPBACK6 = "::1"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return None


def is_wildcard(host: str | None) -> bool:
    """Whether ``host`` means "every interface" (it can be listened on, never connected to):
    ``0.0.0.0``, ``::`` (in any spelling), or none.

    Example:
        >>> is_wildcard("0.0.0.0"), is_wildcard("::"), is_wildcard("[0:0::0]"), is_wildcard("10.1.2.3")
        (True, True, True, False)
    """
    if host is None or not host.strip():
        return True
    address = _ip(host)
    return address is not None and address.is_unspecified


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (``127.x``, ``::1``, ``localhost``).

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("198.18.0.2")
        (True, True, False)
    """
    if host.strip("[]").lower() == "localhost":
        return True
    address = _ip(host)
    return address is not None and address.is_loopback


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets.

    Example:
        >>> host_port("10.0.0.5", 80), host_port("::1", 80)
        ('10.0.0.5:80', '[::1]:80')
    """
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def service_hosts(urls: Iterable[str | None]) -> list[str]:
    """The hosts of discovery and NATS URLs (``etcd://H:P``, ``nats://H:P,nats://H2:P``, or
    ``H:P`` without a scheme); local backends (``memory``, ``file://``, ``static``) name none.

    Example:
        >>> service_hosts(["etcd://10.0.0.2:2379", "10.0.0.3:4222,nats://10.0.0.4:4222", "file:///tmp/d"])
        ['10.0.0.2', '10.0.0.3', '10.0.0.4']
    """
    hosts = []
    for url in urls:
        if not url or url in ("memory", "static") or url.startswith("file://"):
            continue
        for part in url.split(","):
            part = part.strip()
            host = urlsplit(part if "://" in part else f"nats://{part}").hostname
            if host:
                hosts.append(host)
    return hosts


def route_source(toward: str, family: int = socket.AF_UNSPEC) -> str:
    """This machine's address on the interface that reaches ``toward`` (no packet is sent: a
    UDP socket is connected and asked its own address); ``family`` picks IPv4 or IPv6. Blocks
    while a host name is resolved.

    Example:
        >>> route_source("127.0.0.1")
        '127.0.0.1'

    Raises:
        ConfigError: ``toward`` does not resolve, or nothing here routes to it.
    """
    try:
        infos = socket.getaddrinfo(toward, 9, family, socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve {toward!r} ({exc}): give the address to listen on and advertise"
        ) from None
    error: OSError | None = None
    for info_family, kind, proto, _, address in infos:
        with socket.socket(info_family, kind, proto) as probe:
            try:
                probe.connect(address)
            except OSError as exc:
                error = exc
                continue
            return str(probe.getsockname()[0])
    raise ConfigError(
        f"no route from here to {toward} ({error.strerror if error else 'no address'}): "
        "give the address to listen on and advertise"
    )


@dataclass
class AddressRule:
    """The listen/advertise rule of one process, from the hosts of its discovery and NATS.

    Example:
        >>> rule = AddressRule.toward(["memory"])
        >>> rule.listen(None), rule.advertise("::")
        ('127.0.0.1', '::1')

    Attributes:
        remote: the first discovery/NATS host that is not this machine's loopback, else None
            (everything is local: loopback is enough).
    """

    remote: str | None = None
    _own: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def toward(cls, urls: Iterable[str | None]) -> AddressRule:
        """The rule for a process whose discovery and NATS are at ``urls``."""
        remote = [host for host in service_hosts(urls) if not is_loopback(host)]
        return cls(remote[0] if remote else None)

    def own_address(self, family: int = socket.AF_UNSPEC) -> str:
        """The address other hosts reach this one at (of ``family``, when given): loopback when
        everything is local, else the one on the interface that reaches the first remote
        service. Looked up once per family (`resolve` does it off the event loop)."""
        if family not in self._own:
            if self.remote is None:
                self._own[family] = _LOOPBACK6 if family == socket.AF_INET6 else LOOPBACK
            else:
                self._own[family] = route_source(self.remote, family)
        return self._own[family]

    async def resolve(self) -> AddressRule:
        """Look `own_address` up in a thread (a host name may need DNS), for any family and for
        IPv4 (what a ``0.0.0.0`` listener advertises); returns itself."""
        if self.remote is not None and socket.AF_UNSPEC not in self._own:
            await asyncio.to_thread(self.own_address)
            try:
                await asyncio.to_thread(self.own_address, socket.AF_INET)
            except ConfigError:
                pass  # an IPv6-only route: asked for again (and failing) only for a 0.0.0.0 listener
        return self

    def listen(self, requested: str | None) -> str:
        """The host to listen on: ``requested``, else `own_address`."""
        return requested.strip() if requested and requested.strip() else self.own_address()

    def advertise(
        self, listen: str | None, requested: str | None = None, *, what: str | None = "a server"
    ) -> str:
        """The host to advertise for a listener on ``listen``: ``requested``, else ``listen``,
        else (a wildcard) `own_address` in the wildcard's family. A loopback advertised while
        discovery is remote is logged (``what`` names the server; None: not logged): other
        hosts could not connect to it.

        Raises:
            ConfigError: ``requested`` is a wildcard.
        """
        if requested and requested.strip():
            if is_wildcard(requested):
                raise ConfigError(
                    f"cannot advertise {requested!r} for {what or 'a server'}: nobody can connect to a wildcard; "
                    "give this host's address (or leave it out to use the one that reaches discovery)"
                )
            host = requested.strip().strip("[]")
        elif is_wildcard(listen):
            ip = _ip(listen or "")
            host = self.own_address(socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET)
        else:
            host = str(listen).strip().strip("[]")
        if what is not None and self.remote is not None and is_loopback(host):
            logger.warning(
                "%s advertises %s while discovery/NATS is at %s: other hosts cannot reach it; "
                "listen on (or advertise) this host's address instead",
                what,
                host,
                self.remote,
            )
        return host


def free_port(*, bound_later: bool = False) -> int:
    """A TCP port free on 127.0.0.1 now (for a server about to bind it).

    ``bound_later``: for a server that binds it only much later (an engine's side channel, bound
    when the engine has started, tens of seconds on): the port is drawn below the kernel's
    ephemeral range, where no other ``bind(0)`` or outgoing connection lands meanwhile.

    Example:
        >>> 0 < free_port() < 65536, 1024 < free_port(bound_later=True) < 65536
        (True, True)
    """
    if bound_later:
        low = _ephemeral_low()
        for _ in range(64):
            port = random.randint(max(1025, low // 2), low - 1)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's; 32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return max(2048, int(ranges.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768
