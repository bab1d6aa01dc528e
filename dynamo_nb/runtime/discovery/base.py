"""What every discovery backend provides, and the live views built on it."""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from ..instance import Instance, instance_key, instances_prefix
from ..names import EndpointPath

__all__ = ["Discovery", "InstanceSet", "KeyValueDiscovery", "PrefixWatch"]

logger = logging.getLogger("dynamo_nb.discovery")

Listener = Callable[[str, "bytes | None"], None]


class PrefixWatch:
    """A live copy of every key under ``prefix``; listeners hear each put (value) and delete (None).

    After a discovery reset (etcd back with an empty data directory, a wiped discovery folder)
    the keys the store lost are *retained*: still listed, until their owner writes them again or
    ``retain_seconds`` pass (the caller's request plane skips an instance that fails in-band
    meanwhile), so serving goes on with what worked while the workers re-register.

    Example:
        >>> watch = PrefixWatch("v1/")
        >>> watch.replace_all({"v1/a": b"1", "v1/b": b"2"})
        >>> watch.replace_all({"v1/a": b"1"}, reset=True, retain_seconds=30)
        >>> sorted(watch.items), sorted(watch.retained)
        (['v1/a', 'v1/b'], ['v1/b'])
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: dict[str, bytes] = {}
        self.retained: dict[str, float] = {}  # key the store lost in a reset → when to drop it (monotonic)
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def apply(self, key: str, value: bytes | None) -> None:
        """Record one change and tell the listeners."""
        self.retained.pop(key, None)  # written or deleted by its owner again: no longer retained
        if value is None:
            if self.items.pop(key, None) is None:
                return
        else:
            if self.items.get(key) == value:
                return
            self.items[key] = value
        for listener in self._listeners:
            try:
                listener(key, value)
            except Exception:
                logger.exception("discovery listener failed for %s", key)

    def replace_all(
        self, snapshot: dict[str, bytes], *, reset: bool = False, retain_seconds: float = 0.0
    ) -> None:
        """Converge to ``snapshot`` (after a reconnect, or a folder's poll), emitting only the
        differences. With ``reset`` (the store lost its data) the keys missing from it are
        retained for ``retain_seconds``; retained keys still missing are dropped once due."""
        now = time.monotonic()
        if reset:
            lost = [key for key in self.items if key not in snapshot and key not in self.retained]
            self.retained.update(dict.fromkeys(lost, now + retain_seconds))
            if lost:
                logger.warning(
                    "discovery lost %d key(s) under %s in a reset; retaining them for %g s "
                    "until their owners write them again",
                    len(lost), self.prefix, retain_seconds,
                )  # fmt: skip
        for key in [k for k in self.items if k not in snapshot]:
            if self.retained.get(key, 0.0) <= now:
                self.apply(key, None)
        for key, value in snapshot.items():
            self.apply(key, value)

    def drop_retained(self) -> None:
        """Drop the retained keys that are due (their owners never wrote them again)."""
        now = time.monotonic()
        for key in [k for k, due in self.retained.items() if due <= now]:
            self.apply(key, None)


class InstanceSet:
    """The live set of instances of one endpoint.

    Example:
        >>> s = InstanceSet(EndpointPath.parse("demo.echo.generate"))
        >>> s.ids()
        []
    """

    def __init__(self, path: EndpointPath, *, static: bool = False) -> None:
        self.path = path
        self.static = static  # fixed instances: nothing to watch, never marked down for good
        self._instances: dict[int, Instance] = {}
        self._sorted_ids: list[int] = []
        self.version = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._readded: list[Callable[[int], None]] = []

    def ids(self) -> list[int]:
        """Instance ids, sorted."""
        return self._sorted_ids

    def get(self, instance_id: int) -> Instance | None:
        return self._instances.get(instance_id)

    def all(self) -> list[Instance]:
        return [self._instances[i] for i in self._sorted_ids]

    def on_added(self, callback: Callable[[int], None]) -> None:
        """``callback(instance_id)`` whenever an instance is (re-)published."""
        self._readded.append(callback)

    def put(self, instance: Instance) -> None:
        self._instances[instance.instance_id] = instance
        self._changed()
        for callback in self._readded:
            callback(instance.instance_id)

    def remove(self, instance_id: int) -> None:
        if self._instances.pop(instance_id, None) is not None:
            self._changed()

    def _changed(self) -> None:
        self._sorted_ids = sorted(self._instances)
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_changed(self, timeout: float) -> None:
        """Wait for the next change, at most ``timeout`` seconds."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass

    def listen_to(self, watch: PrefixWatch) -> None:
        """Follow the instance records of a prefix watch."""

        def on_change(key: str, value: bytes | None) -> None:
            instance_id = _id_from_key(key)
            if instance_id is None:
                return
            if value is None:
                self.remove(instance_id)
                return
            try:
                instance = Instance.from_json(value)
            except ValueError:
                logger.warning("ignoring malformed instance record at %s: %r", key, value[:200])
                return
            self.put(instance)

        watch.add_listener(on_change)
        for key, value in list(watch.items.items()):
            on_change(key, value)


async def cancel_tasks(tasks: list[asyncio.Task[None]], timeout: float = 2.0) -> None:
    """Cancel a backend's background tasks and wait (at most ``timeout`` s) until they end."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


def _id_from_key(key: str) -> int | None:
    try:
        return int(key.rsplit("/", 1)[1], 16)
    except (IndexError, ValueError):
        return None


class Discovery(ABC):
    """Who serves what. Backends: memory, file, etcd, static."""

    kind: str = ""

    def __init__(self) -> None:
        self.connection_id = 0  # this runtime's id (etcd: its lease id)
        self._instance_sets: dict[EndpointPath, InstanceSet] = {}

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def register_instance(self, instance: Instance) -> None:
        """Publish ``instance`` for as long as this runtime lives."""

    @abstractmethod
    async def deregister_instance(self, instance: Instance) -> None: ...

    async def instance_set(self, path: EndpointPath) -> InstanceSet:
        """The live instance set of ``path`` (shared by every client of this runtime)."""
        found = self._instance_sets.get(path)
        if found is None:
            found = await self._new_instance_set(path)
            self._instance_sets[path] = found
        return found

    @abstractmethod
    async def _new_instance_set(self, path: EndpointPath) -> InstanceSet: ...

    def describe(self) -> str:
        return self.kind


class KeyValueDiscovery(Discovery):
    """A discovery backend over a key-value store whose keys live as long as the runtime."""

    lease_ttl: float = 0.0  # seconds a dead runtime's keys outlive it (a backend with leases sets it)

    @property
    def retain_seconds(self) -> float:
        """How long the keys a reset lost stay listed while their owners write them again."""
        return 3.0 * self.lease_ttl

    @abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Write a key owned by this runtime (removed when it shuts down or dies)."""

    @abstractmethod
    async def delete(self, key: str) -> None: ...

    @abstractmethod
    async def watch_prefix(self, prefix: str) -> PrefixWatch:
        """A live view of every key under ``prefix``."""

    async def register_instance(self, instance: Instance) -> None:
        await self.put(instance_key(instance.path, instance.instance_id), instance.to_json())

    async def deregister_instance(self, instance: Instance) -> None:
        await self.delete(instance_key(instance.path, instance.instance_id))

    async def _new_instance_set(self, path: EndpointPath) -> InstanceSet:
        instance_set = InstanceSet(path)
        instance_set.listen_to(await self.watch_prefix(instances_prefix(path)))
        return instance_set


def no_instances_message(path: EndpointPath, discovery: str, timeout: float | None = None) -> str:
    """The text of a `NoInstancesError`, with what to check."""
    waited = f" within {timeout:g} s" if timeout is not None else ""
    return (
        f"no instances of {path.url} found{waited} (discovery: {discovery}). Is a worker serving "
        f"'{path}' on the same discovery backend and namespace? Start one with "
        "`await endpoint.serve(handler)` or check the worker's log."
    )
