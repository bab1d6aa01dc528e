"""In-process discovery: one store shared by every runtime of this Python process."""

from __future__ import annotations

from ..ids import new_instance_id
from .base import KeyValueDiscovery, PrefixWatch

__all__ = ["MemoryDiscovery"]


class _MemoryStore:
    """The process-wide key-value store behind ``discovery="memory"``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.watches: list[PrefixWatch] = []

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value
        for watch in list(self.watches):
            if key.startswith(watch.prefix):
                watch.apply(key, value)

    def delete(self, key: str) -> None:
        if self.data.pop(key, None) is None:
            return
        for watch in list(self.watches):
            if key.startswith(watch.prefix):
                watch.apply(key, None)


STORE = _MemoryStore()


class MemoryDiscovery(KeyValueDiscovery):
    """Discovery inside one process; a runtime's keys vanish when it shuts down.

    Example::

        rt = await DistributedRuntime.create(discovery="memory")
    """

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._owned: set[str] = set()
        self._watches: list[PrefixWatch] = []

    async def start(self) -> None:
        self.connection_id = new_instance_id()

    async def close(self) -> None:
        for key in list(self._owned):
            STORE.delete(key)
        self._owned.clear()
        for watch in self._watches:
            if watch in STORE.watches:
                STORE.watches.remove(watch)
        self._watches.clear()

    async def put(self, key: str, value: bytes) -> None:
        self._owned.add(key)
        STORE.put(key, value)

    async def delete(self, key: str) -> None:
        self._owned.discard(key)
        STORE.delete(key)

    async def watch_prefix(self, prefix: str) -> PrefixWatch:
        watch = PrefixWatch(prefix)
        for key, value in list(STORE.data.items()):
            if key.startswith(prefix):
                watch.apply(key, value)
        STORE.watches.append(watch)
        self._watches.append(watch)
        return watch
