"""Where a listener listens and which address it advertises: one rule for every server of a
component (the TCP request plane, the bootstrap server, the frontend's URL).

- **Listen**: the host given (``--tcp-host``, ``--bootstrap-host``…); by default loopback when
  discovery and NATS are on this machine (memory, ``file://``, a loopback etcd/NATS URL), else
  the address of this machine's interface that reaches them (as Dynamo detects
  ``DYN_TCP_RPC_HOST``) — so a worker whose etcd runs on another host is reachable from there
  with no flag at all.
- **Advertise** (what goes into discovery, a READY line, ``bootstrap_info``): the host given
  (``--tcp-advertise-host``…); by default the listen host, or — when that is a wildcard
  (``0.0.0.0``, ``::``) — the address that reaches discovery (loopback when it is local). A
  wildcard is never advertised: nobody can connect to it.

Example:
    >>> rule = AddressRule.toward(["etcd://127.0.0.1:2379", None])
    >>> rule.listen(None), rule.advertise("0.0.0.0")
    ('127.0.0.1', '127.0.0.1')
    >>> rule.advertise("0.0.0.0", "10.0.0.5")
    '10.0.0.5'
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = ["LOOPBACK", "AddressRule", "is_loopback", "is_wildcard", "route_source", "service_hosts"]

logger = logging.getLogger("dynamo_nb.addresses")

LOOPBACK = "127.0.0.1"
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means "every interface" (it can be listened on, never connected to).

    Example:
        >>> is_wildcard("0.0.0.0"), is_wildcard("::"), is_wildcard("10.1.2.3")
        (True, True, False)
    """
    return host.strip() in _WILDCARDS


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (``127.x``, ``::1``, ``localhost``).

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("198.18.0.2")
        (True, True, False)
    """
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def service_hosts(urls: Iterable[str | None]) -> list[str]:
    """The hosts of discovery and NATS URLs (``etcd://H:P``, ``nats://H:P,nats://H2:P``); URLs
    of local backends (``memory``, ``file://``, ``static``) name no host.

    Example:
        >>> service_hosts(["etcd://10.0.0.2:2379", "nats://10.0.0.3:4222,nats://10.0.0.4:4222", "file:///tmp/d"])
        ['10.0.0.2', '10.0.0.3', '10.0.0.4']
    """
    hosts = []
    for url in urls:
        if not url or "://" not in url or url.startswith("file://"):
            continue
        for part in url.split(","):
            host = urlsplit(part if "://" in part else f"nats://{part}").hostname
            if host:
                hosts.append(host)
    return hosts


def route_source(toward: str) -> str:
    """This machine's address on the interface that reaches ``toward`` (no packet is sent: a
    UDP socket is connected and asked its own address).

    Raises:
        ConfigError: nothing here routes to ``toward``.
    """
    try:
        infos = socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConfigError(f"cannot resolve {toward!r} ({exc}): give the address to advertise") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.connect(address)
        except OSError as exc:
            raise ConfigError(
                f"no route from here to {toward} ({exc.strerror or exc}): give the address to listen on and advertise"
            ) from None
        return str(probe.getsockname()[0])


@dataclass(frozen=True)
class AddressRule:
    """The listen/advertise rule of one process, from the hosts of its discovery and NATS.

    Attributes:
        remote: the first discovery/NATS host that is not this machine's loopback, else None
            (everything is local: loopback is enough).
    """

    remote: str | None = None

    @classmethod
    def toward(cls, urls: Iterable[str | None]) -> AddressRule:
        """The rule for a process whose discovery and NATS are at ``urls``."""
        remote = [host for host in service_hosts(urls) if not is_loopback(host)]
        return cls(remote[0] if remote else None)

    def own_address(self) -> str:
        """The address other hosts reach this one at: loopback when everything is local, else
        the one on the interface that reaches the first remote service."""
        return LOOPBACK if self.remote is None else route_source(self.remote)

    def listen(self, requested: str | None) -> str:
        """The host to listen on: ``requested``, else `own_address`."""
        return requested.strip() if requested and requested.strip() else self.own_address()

    def advertise(self, listen: str, requested: str | None = None, *, what: str = "a server") -> str:
        """The host to advertise for a listener on ``listen``: ``requested``, else ``listen``,
        else (a wildcard) `own_address`. A loopback advertised while discovery is remote is
        logged: other hosts could not connect to it.

        Raises:
            ConfigError: ``requested`` is a wildcard.
        """
        if requested and requested.strip():
            if is_wildcard(requested):
                raise ConfigError(
                    f"cannot advertise {requested!r} for {what}: nobody can connect to a wildcard; "
                    "give this host's address (or leave it out to use the one that reaches discovery)"
                )
            host = requested.strip()
        else:
            host = self.own_address() if is_wildcard(listen) else listen
        if self.remote is not None and is_loopback(host):
            logger.warning(
                "%s advertises %s while discovery/NATS is at %s: other hosts cannot reach it; "
                "listen on (or advertise) this host's address instead",
                what,
                host,
                self.remote,
            )
        return host
