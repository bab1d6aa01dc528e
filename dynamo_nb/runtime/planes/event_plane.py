"""The event plane: fire-and-forget messages from workers to whoever listens (KV events, load).

It follows discovery: with memory discovery an in-process bus, otherwise NATS pub/sub
(``nats_url``). Payloads are msgpack maps; nothing is pickled. Delivery is in order per
publisher and at most once: a listener that must not miss anything numbers the messages and
repairs gaps itself (as the KV indexer does).

Example:
    >>> plane = InProcEventPlane()
    >>> async def main():
    ...     got = []
    ...     await plane.subscribe("dyn.events.ns.comp.kv", got.append)
    ...     await plane.publish("dyn.events.ns.comp.kv", {"n": 1})
    ...     await asyncio.sleep(0)
    ...     return got
    >>> asyncio.run(main())
    [{'n': 1}]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgpack

from ...errors import ConfigError
from ..bounded_decode import unpack_bounded

__all__ = ["EventPlane", "InProcEventPlane", "NatsEventPlane", "event_subject", "make_event_plane"]

logger = logging.getLogger("dynamo_nb.events")

Listener = Callable[[dict[str, Any]], None]


def event_subject(namespace: str, component: str, topic: str) -> str:
    """``dyn.events.{namespace}.{component}.{topic}``."""
    return f"dyn.events.{namespace}.{component}.{topic}"


class EventPlane:
    """Publish a map to a subject; listeners of that subject get it."""

    name = "base"

    async def publish(self, subject: str, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    async def subscribe(self, subject: str, listener: Listener) -> Callable[[], None]:
        """Call ``listener(payload)`` for every message on ``subject``; returns an unsubscribe function."""
        raise NotImplementedError

    def on_reconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` whenever the plane reconnects after losing its server (events may
        have been lost meanwhile); returns a function that undoes it. In-process planes never do."""
        return lambda: None

    async def close(self) -> None:
        return None


class InProcEventPlane(EventPlane):
    """One bus for the whole process: every runtime with memory discovery shares it."""

    name = "inproc"
    _listeners: dict[str, list[Listener]] = {}  # noqa: RUF012 - process-wide on purpose

    async def publish(self, subject: str, payload: dict[str, Any]) -> None:
        data = msgpack.packb(payload)  # the same encoding rules as over NATS
        loop = asyncio.get_running_loop()
        for listener in list(self._listeners.get(subject, ())):
            loop.call_soon(_deliver, listener, msgpack.unpackb(data))

    async def subscribe(self, subject: str, listener: Listener) -> Callable[[], None]:
        self._listeners.setdefault(subject, []).append(listener)

        def unsubscribe() -> None:
            listeners = self._listeners.get(subject, [])
            if listener in listeners:
                listeners.remove(listener)

        return unsubscribe


class NatsEventPlane(EventPlane):
    """NATS pub/sub on its own connection (opened on first use)."""

    name = "nats"

    def __init__(self, url: str, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self._nc: Any = None
        self._lock = asyncio.Lock()
        self._closing = False
        self._on_reconnect: list[Callable[[], None]] = []

    async def _connection(self) -> Any:
        async with self._lock:
            if self._nc is None:
                from .nats import connect_nats

                self._nc = await connect_nats(
                    self.url,
                    timeout=self.connect_timeout,
                    closing=lambda: self._closing,
                    on_reconnect=self._reconnected,
                )
        return self._nc

    def on_reconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._on_reconnect.append(callback)
        return lambda: self._on_reconnect.remove(callback) if callback in self._on_reconnect else None

    def _reconnected(self) -> None:
        for callback in list(self._on_reconnect):
            try:
                callback()
            except Exception:
                logger.exception("a NATS reconnect callback failed")

    async def publish(self, subject: str, payload: dict[str, Any]) -> None:
        nc = await self._connection()
        await nc.publish(subject, msgpack.packb(payload))

    async def subscribe(self, subject: str, listener: Listener) -> Callable[[], None]:
        nc = await self._connection()

        async def on_message(message: Any) -> None:
            try:
                payload = unpack_bounded(message.data)
            except (ValueError, msgpack.ExtraData, msgpack.FormatError) as exc:
                logger.warning("dropping a malformed event on %s: %s", subject, exc)
                return
            _deliver(listener, payload)

        subscription = await nc.subscribe(subject, cb=on_message)

        def unsubscribe() -> None:
            task = asyncio.get_running_loop().create_task(_unsubscribe_quietly(subscription, subject))
            _UNSUBSCRIBING.add(task)
            task.add_done_callback(_UNSUBSCRIBING.discard)

        return unsubscribe

    async def close(self) -> None:
        self._closing = True
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 3.0)
            except (asyncio.TimeoutError, OSError):
                pass
            self._nc = None


_UNSUBSCRIBING: set[asyncio.Task[None]] = set()  # held until done


async def _unsubscribe_quietly(subscription: Any, subject: str) -> None:
    """Unsubscribe; a connection already closed (shutting down) has nothing left to undo."""
    try:
        await subscription.unsubscribe()
    except Exception as exc:
        logger.debug("unsubscribing from %s: %s", subject, exc)


def _deliver(listener: Listener, payload: Any) -> None:
    if not isinstance(payload, dict):
        logger.warning("dropping an event that is not a map: %r", payload)
        return
    try:
        listener(payload)
    except Exception:
        logger.exception("an event listener failed")


def make_event_plane(discovery_kind: str, nats_url: str | None, connect_timeout: float = 5.0) -> EventPlane:
    """In-process with memory discovery, NATS when ``nats_url`` is given; else a ConfigError saying so."""
    if nats_url:
        return NatsEventPlane(nats_url, connect_timeout)
    if discovery_kind == "memory":
        return InProcEventPlane()
    raise ConfigError(
        "events across processes (KV events) travel over NATS: create the runtime with nats_url= "
        "(or --nats-url); with memory discovery they stay in this process"
    )
