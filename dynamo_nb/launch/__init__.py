"""Start programs from a notebook or a script: components as subprocesses, etcd and nats-server.

- ``paths.py``: `resolve_program`, the file a relative program names; ``programs.py``: a
  notebook as a program (its export cached by code, checked for its one declaration without
  running it); ``declarations.py``: which component a file declares (``FILE:NAME``);
- ``launcher.py``: `launch` starts a component in its own process group, waits for its READY
  line (or its instance in discovery), shows its output live and returns a `ManagedProcess`;
- ``servers.py``: `launch_server` starts a server that prints no READY line (``vllm serve``,
  Dynamo's frontend), ready once it answers over HTTP; `launch_upstream` an upstream worker in
  front of it;
- ``services.py``: `LocalServices` runs etcd and nats-server on free 127.0.0.1 ports;
- ``process_group.py`` and ``parent_guard.py``: stopping a whole process group, and a child
  that dies with its parent; ``logview.py``: where a launched program's lines are shown;
- ``ledger.py`` and ``reaper.py``: what this process launched, stopped by its reaper when it
  dies in any way (a killed kernel), and `leftovers` a dead owner left, which the next first
  launch stops (or `adopt_leftovers` takes over).

Several hosts on one machine to launch components in (`HostNetwork`, root only) are in
`dynamo_nb.testing`, the test lab; ``network_host.py``'s `NetworkHost` is what launch uses of one.

Example:
    >>> from dynamo_nb.launch import launched
    >>> launched()
    []
"""

from __future__ import annotations

from .launcher import DEFAULT_READY_PATTERN, ManagedProcess, adopt_leftovers, launch, launched
from .ledger import Leftover, leftovers
from .servers import launch_server, launch_upstream, wait_until_answering
from .services import LocalServices, find_binary

__all__ = [
    "DEFAULT_READY_PATTERN",
    "Leftover",
    "LocalServices",
    "ManagedProcess",
    "adopt_leftovers",
    "find_binary",
    "launch",
    "launch_server",
    "launch_upstream",
    "launched",
    "leftovers",
    "wait_until_answering",
]
