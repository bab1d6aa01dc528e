"""Discovery backends: who serves what.

- ``base.py``: `Discovery`, what every backend provides, and the live views on it
  (`InstanceSet`, `PrefixWatch`);
- ``memory.py``: ``memory`` (one process);
- ``file.py``: ``file://DIR`` (processes of one host, through a folder);
- ``etcd.py``: ``etcd://HOST:PORT`` (leases and watches, across machines);
- ``static.py``: ``static`` (no discovery service: fixed NATS subjects or explicit TCP addresses).
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import Discovery, InstanceSet, KeyValueDiscovery, PrefixWatch
from .etcd import DEFAULT_LEASE_TTL, EtcdDiscovery
from .file import FileDiscovery
from .memory import MemoryDiscovery
from .static import StaticDiscovery

__all__ = [
    "DEFAULT_LEASE_TTL",
    "Discovery",
    "EtcdDiscovery",
    "FileDiscovery",
    "InstanceSet",
    "KeyValueDiscovery",
    "MemoryDiscovery",
    "PrefixWatch",
    "StaticDiscovery",
    "make_discovery",
]


def make_discovery(
    spec: str, *, lease_ttl: float = DEFAULT_LEASE_TTL, connect_timeout: float = 5.0
) -> Discovery:
    """Build the backend named by ``spec``: ``memory``, ``static``, ``file://DIR`` or ``etcd://HOST:PORT``.

    Example:
        >>> make_discovery("memory").kind
        'memory'
    """
    if spec == "memory":
        return MemoryDiscovery()
    if spec == "static":
        return StaticDiscovery()
    if isinstance(spec, str) and spec.startswith("etcd://"):
        return EtcdDiscovery(spec, lease_ttl=lease_ttl, connect_timeout=connect_timeout)
    if isinstance(spec, str) and spec.startswith("file://"):
        return FileDiscovery(spec, lease_ttl=lease_ttl)
    raise ConfigError(
        f"unknown discovery {spec!r}: use 'memory' (one process), 'file://DIR' (processes of one host, "
        "no etcd), 'etcd://HOST:PORT' (e.g. services.etcd_url from LocalServices) or 'static' (no discovery service)"
    )
