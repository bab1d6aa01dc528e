"""Per-request context: id and cancellation, linked parent → child."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .ids import new_request_id

__all__ = ["Context"]


class Context:
    """The id and the stop signal of one request.

    A handler receives it as its optional second argument; a caller can pass one to
    ``client.round_robin(request, context=ctx)`` to link the remote request to it: stopping
    the parent stops every linked child, across processes. Its ``metadata`` (a dict of
    JSON-able values) reaches the handler's context too.

    A server sets ``emit`` on the context it hands a handler: ``emit(item)`` sends one stream
    item to the caller at once, in order with what the handler yields. Code that produces items
    outside the handler's task (an engine's step) sends them with it, instead of waking that
    task for each one; it is None outside a server.

    Example:
        >>> ctx = Context()
        >>> child = Context(parent=ctx)
        >>> ctx.stop_generating()
        >>> child.is_stopped()
        True
    """

    __slots__ = ("_callbacks", "_event", "_id", "_parent_unlink", "_stopped", "emit", "metadata")

    def __init__(
        self, id: str | None = None, *, parent: Context | None = None, metadata: dict[str, Any] | None = None
    ) -> None:
        self._id = id if id is not None else (parent.id if parent is not None else new_request_id())
        #: JSON-able values that travel with the request to the handler (a child starts with its parent's)
        self.metadata: dict[str, Any] = dict(
            metadata if metadata is not None else parent.metadata if parent else {}
        )
        #: set by the server running the handler: sends one stream item now (see the class docstring)
        self.emit: Callable[[Any], None] | None = None
        self._stopped = False
        self._event: asyncio.Event | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._parent_unlink: Callable[[], None] | None = None
        if parent is not None:
            self._parent_unlink = parent.add_stop_callback(self.stop_generating)

    @property
    def id(self) -> str:
        """The request id (a child shares its parent's id)."""
        return self._id

    def stop_generating(self) -> None:
        """Ask the request to stop; linked children and the remote handler stop too."""
        if self._stopped:
            return
        self._stopped = True
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def is_stopped(self) -> bool:
        """True once `stop_generating` was called here or on a parent."""
        return self._stopped

    async def stopped(self, timeout: float | None = None) -> bool:
        """Wait until the request is stopped; returns False if ``timeout`` seconds pass first."""
        if self._stopped:
            return True
        if self._event is None:
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def add_stop_callback(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call ``callback()`` when the request stops (at once if it already has).

        Returns a function that removes the callback again.
        """
        if self._stopped:
            callback()
            return _noop
        self._callbacks.append(callback)

        def remove() -> None:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

        return remove

    def unlink(self) -> None:
        """Detach from the parent (called when the request finishes)."""
        if self._parent_unlink is not None:
            self._parent_unlink()
            self._parent_unlink = None

    def __repr__(self) -> str:
        return f"<Context id={self._id} stopped={self._stopped}>"


def _noop() -> None:
    return None
