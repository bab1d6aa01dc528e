"""The load a worker's own server reports, for routers that count only what they sent.

A router counts the requests it routed (least-loaded) or their blocks (the KV router). A worker
in front of a server that others use too — an upstream worker before a `vllm serve` that also
takes requests directly, or from another frontend — knows more: it reads the server's
Prometheus ``/metrics`` and its ``stats`` endpoint answers ``server_running``,
``server_waiting``, ``server_kv_usage`` and (where the server says) ``server_kv_blocks``.

`ServerLoads` asks each instance's ``stats`` every ``interval`` seconds and keeps the last
answer as a `ServerLoad`. An instance whose stats carry no ``server_*`` figures (an engine the
kit hosts: the router already sees all of its load) is asked once and then left alone. Each
answer is stamped with the requests the router had in flight there when it came, so
`ServerLoad.others` — what the server runs that this router did not send — stays right while
the router's own count moves between two answers.

Example::

    loads = await ServerLoads.start(runtime.endpoint("dynamo.backend.stats"))
    router = LeastLoadedRouter(client, server_loads=loads)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime.client import Client
    from ..runtime.distributed import Endpoint

__all__ = ["ServerLoad", "ServerLoads"]

logger = logging.getLogger("dynamo_nb.router")

STATS_ENDPOINT = "stats"


@dataclass(frozen=True)
class ServerLoad:
    """One answer of an instance's server: requests running and waiting, the share of its KV
    cache in use and its size in blocks (None where the server does not say), the requests
    this router had in flight there when the answer came, and, where the worker says, the
    requests the worker had in flight when it read the server (``active_at_check``) and when it
    answered (``active``).

    Example:
        >>> ServerLoad(running=6, waiting=2, routed=3).others
        5
        >>> ServerLoad(running=1, routed=0, active=0, active_at_check=1).others  # read before ours ended
        0
    """

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None
    kv_blocks: int | None = None
    routed: int = 0
    at: float = 0.0
    active: int | None = None
    active_at_check: int | None = None

    @property
    def others(self) -> int:
        """Requests the server runs or queues that this router did not send (never below 0).

        Where the worker says what it had in flight, two parts, each counted at one moment: what
        the server ran beyond the worker's requests when it was read (its clients outside the
        kit), and the worker's requests now beyond this router's (other frontends'). Else the
        server's figures less this router's requests now, which is wrong by the requests that
        started or ended since the server was read."""
        total = round(self.running + self.waiting)
        if self.active is None or self.active_at_check is None:
            return max(total - self.routed, 0)
        return max(total - self.active_at_check, 0) + max(self.active - self.routed, 0)

    @property
    def blocks_in_use(self) -> float | None:
        """KV blocks the server says are in use (its usage times its size), when it says both."""
        if self.kv_usage is None or not self.kv_blocks:
            return None
        return self.kv_usage * self.kv_blocks

    @classmethod
    def from_stats(cls, stats: dict[str, Any], routed: int, at: float) -> ServerLoad | None:
        """The load in a worker's ``stats`` answer; None when it carries no ``server_*`` figure."""
        if not any(key.startswith("server_") for key in stats):
            return None
        usage, blocks = stats.get("server_kv_usage"), stats.get("server_kv_blocks")
        return cls(
            running=float(stats.get("server_running", 0.0)),
            waiting=float(stats.get("server_waiting", 0.0)),
            kv_usage=None if usage is None else float(usage),
            kv_blocks=None if blocks is None else int(blocks),
            routed=routed,
            at=at,
            active=_count(stats.get("active")),
            active_at_check=_count(stats.get("active_at_check")),
        )


def _count(value: Any) -> int | None:
    """A count a worker's stats gave (None where it gave none, or not a number)."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ServerLoads:
    """Each instance's last `ServerLoad`, asked of its ``stats`` endpoint every ``interval`` seconds.

    Attributes:
        loads: instance id → its last load (instances whose server says nothing are absent).
        routed_to: how many requests the router has in flight on an instance now (the router
            sets it: `dynamo_nb.router.LeastLoadedRouter` and `KvRouter` do).
    """

    def __init__(self, client: Client, interval: float = 1.0, timeout: float = 2.0) -> None:
        """Use `ServerLoads.start`."""
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.loads: dict[int, ServerLoad] = {}
        self.routed_to: Callable[[int], int] = lambda _instance: 0
        self._silent: set[int] = set()  # instances whose stats carry no server figures
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, stats: Endpoint, interval: float = 1.0) -> ServerLoads:
        """Follow the instances serving ``stats`` (a worker component's ``stats`` endpoint)."""
        loads = cls(await stats.client(), interval)
        loads._task = asyncio.get_running_loop().create_task(loads._run(), name="dynamo_nb server loads")
        return loads

    def get(self, instance_id: int) -> ServerLoad | None:
        """The last load ``instance_id``'s server reported (None: none known)."""
        return self.loads.get(instance_id)

    async def _run(self) -> None:
        while True:
            await self.refresh(self.client.instance_ids())
            await asyncio.sleep(self.interval)

    async def refresh(self, instance_ids: Iterable[int]) -> None:
        """Ask each of ``instance_ids`` (except those known to say nothing) once, together."""
        ids = [i for i in instance_ids if i not in self._silent]
        for gone in set(self.loads) - set(ids):
            del self.loads[gone]
        await asyncio.gather(*(self._ask(i) for i in ids))

    async def _ask(self, instance_id: int) -> None:
        async def last_answer() -> Any:
            stats = None
            async for item in self.client.direct({}, instance_id):
                stats = item
            return stats

        try:
            stats = await asyncio.wait_for(last_answer(), self.timeout)
        except Exception as exc:  # gone, or no stats endpoint there: ask again next time
            logger.debug("no stats from instance %x: %s", instance_id, exc)
            self.loads.pop(instance_id, None)
            return
        load = None
        if isinstance(stats, dict):
            load = ServerLoad.from_stats(stats, self.routed_to(instance_id), time.monotonic())
        if load is None:
            self._silent.add(instance_id)
        else:
            self.loads[instance_id] = load

    async def stop(self) -> None:
        """Stop asking."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
