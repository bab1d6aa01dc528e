"""The test lab: servers and networks to try the kit against, kept out of what a component loads.

- ``hosts.py``: `HostNetwork`, several hosts on one machine (Linux network namespaces on a
  switch, root only) to launch components and services in, with delay, loss and cuts;
  `netns_unavailable` says why they cannot be made here;
- ``netswitch.py``: that switch, a process of its own (frames between the hosts, shaped);
- ``stub_server.py``: `StubServer`, an OpenAI-compatible server with injected delays, to
  calibrate the load generator (``python -m dynamo_nb.testing.stub_server``).

Each loads when its name is first used: ``import dynamo_nb.testing`` alone loads none of them.

Example::

    from dynamo_nb.testing import StubServer
    async with await StubServer.start(ttft=0.05, itl=0.01) as stub:
        df = await bench.run(stub.url, "stub", concurrency=[1, 8], requests=32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hosts import Host, HostNetwork, netns_unavailable
    from .stub_server import StubServer

__all__ = ["Host", "HostNetwork", "StubServer", "netns_unavailable"]


def __getattr__(name: str) -> Any:
    if name in ("Host", "HostNetwork", "netns_unavailable"):
        from . import hosts

        return getattr(hosts, name)
    if name == "StubServer":
        from .stub_server import StubServer

        return StubServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
