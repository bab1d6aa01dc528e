"""Start programs from a notebook or a script: components as subprocesses, etcd and nats-server.

- ``launcher.py``: `launch` starts a component in its own process group, waits for its READY
  line (or its instance in discovery), shows its output live and returns a `ManagedProcess`;
- ``services.py``: `LocalServices` runs etcd and nats-server on free 127.0.0.1 ports;
- ``process_group.py`` and ``parent_guard.py``: stopping a whole process group, and a child
  that dies with its parent; ``logview.py``: where a launched program's lines are shown;
- ``ledger.py`` and ``reaper.py``: what this process launched, stopped by its reaper when it
  dies in any way (a killed kernel), and `leftovers` a dead owner left, which the next first
  launch stops (or `adopt_leftovers` takes over);
- ``hosts.py``: `HostNetwork`, several hosts on one machine (network namespaces on a switch,
  ``netswitch.py``, with delay, loss and cuts) to launch components in (root only).

Example:
    >>> from dynamo_nb.launch import launched
    >>> launched()
    []
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .launcher import DEFAULT_READY_PATTERN, ManagedProcess, adopt_leftovers, launch, launched
from .ledger import Leftover, leftovers
from .services import LocalServices, find_binary

if TYPE_CHECKING:
    from .hosts import Host, HostNetwork, netns_unavailable

__all__ = [
    "DEFAULT_READY_PATTERN",
    "Host",
    "HostNetwork",
    "Leftover",
    "LocalServices",
    "ManagedProcess",
    "adopt_leftovers",
    "find_binary",
    "launch",
    "launched",
    "leftovers",
    "netns_unavailable",
]


def __getattr__(name: str) -> Any:  # the multi-host harness (network namespaces) loads when asked for
    if name in ("Host", "HostNetwork", "netns_unavailable"):
        from . import hosts

        return getattr(hosts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
