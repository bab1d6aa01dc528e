"""Client side: pick an instance, open a stream, hand the caller its items."""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import InstanceDownError, InstanceNotFoundError, NoInstancesError, RequestError
from .context import Context
from .discovery.base import InstanceSet, no_instances_message
from .instance import Instance, parse_instance_id
from .planes.channel import NOT_READY, StreamChannel
from .suspects import SuspectInstances

if TYPE_CHECKING:
    from .distributed import Endpoint
    from .planes import RequestPlane, StreamHandle

__all__ = ["DOWN_SECONDS", "Client", "ResponseStream"]

# An instance reported down is skipped for this long, unless discovery re-publishes it first.
DOWN_SECONDS = 10.0

_NEW, _OPEN, _DONE = 0, 1, 2


class ResponseStream:
    """The items of one request, as an async iterator.

    Iterate it with ``async for``; or ``await`` it first (as in Dynamo) to send the request
    and learn which instance took it. Leaving the loop early, `aclose`, cancelling the
    caller, or ``stream.context.stop_generating()`` stops the remote handler.

    Example::

        async for item in client.round_robin({"text": "hi"}):
            print(item)
        stream = await client.random({"text": "hi"})
        stream.instance_id
    """

    __slots__ = (
        "__weakref__",
        "_body",
        "_channel",
        "_client",
        "_handle",
        "_state",
        "_unhook",
        "context",
        "instance",
    )

    def __init__(self, client: Client, instance: Instance, body: Any, parent: Context | None) -> None:
        self._client = client
        self.instance = instance
        self._body = body
        self.context = Context(parent=parent) if parent is not None else Context()
        self._channel = StreamChannel(instance)
        self._handle: StreamHandle | None = None
        self._state = _NEW
        self._unhook: Callable[[], None] | None = None

    @property
    def instance_id(self) -> int:
        """The instance serving this request."""
        return self.instance.instance_id

    @property
    def ready(self) -> int:
        """Items (or its end) received and not read yet: reading them does not wait. A writer
        uses it to send what is ready in one write."""
        return self._channel.ready

    @property
    def request_id(self) -> str:
        return self.context.id

    def __await__(self) -> Any:
        return self._started().__await__()

    async def _started(self) -> ResponseStream:
        if self._state == _NEW:
            await self._start()
        return self

    async def _start(self) -> None:
        self._state = _OPEN
        try:
            self._handle = await self._client._plane.open_stream(
                self.instance, self.context.id, self._body, self._channel, self.context.metadata or None
            )
        except InstanceDownError:
            self._client.report_instance_down(self.instance.instance_id)
            self._finish()
            raise
        except BaseException:
            self._finish()
            raise
        self._body = None
        if self.context.is_stopped():
            # stopped before it was sent (a parent that stopped): it is still delivered, so the
            # handler's bookkeeping runs and it sees the stop; the caller gets no items
            self._channel.push_end()
        # The callback holds the handle, not the stream: no reference cycle, so a stream
        # dropped after `break` is collected at once and its __del__ stops the handler.
        self._unhook = self.context.add_stop_callback(self._handle.stop)

    def __aiter__(self) -> ResponseStream:
        return self

    def next_ready(self) -> Any:
        """The next item if it has already arrived, else `NOT_READY` (then ``await`` the stream:
        its end, its error or the next item): a relay reads a burst of tokens without a
        coroutine per token.

        Example::

            item = stream.next_ready()
            if item is NOT_READY:
                item = await stream.__anext__()
        """
        if self._state != _OPEN:
            return NOT_READY
        return self._channel.pop_item()

    async def __anext__(self) -> Any:
        if self._state != _OPEN:
            if self._state == _DONE:
                raise StopAsyncIteration
            await self._start()
        try:
            return await self._channel.next()
        except StopAsyncIteration:
            self._finish()
            raise
        except InstanceDownError:
            self._client.report_instance_down(self.instance.instance_id)
            self._finish()
            raise
        except asyncio.CancelledError:  # the caller was cancelled: stop the remote handler
            self._abandon()
            raise
        except BaseException:
            self._finish()
            raise

    def _finish(self) -> None:
        self._state = _DONE
        if self._handle is not None:
            self._handle.release()
            self._handle = None
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        self.context.unlink()

    def _abandon(self) -> None:
        if self._state == _OPEN and not self._channel.closed:
            self.context.stop_generating()
        self._finish()

    def give_up(self, error: RequestError) -> None:
        """Stop waiting for this stream: the remote handler is told to stop (it may never hear,
        if it hangs) and the reader's next wait raises ``error`` (items already received are read
        first). A watchdog's way out of a stream whose worker hangs."""
        if self._state == _OPEN and not self._channel.closed:
            self.context.stop_generating()
        self._channel.push_error(error)

    async def aclose(self) -> None:
        """Stop the request (if still running) and release it."""
        self._abandon()

    async def __aenter__(self) -> ResponseStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._abandon()

    def __del__(self) -> None:
        if self._state == _OPEN:
            try:
                self._abandon()
            except Exception:  # interpreter or loop shutting down
                pass

    def __repr__(self) -> str:
        state = ("new", "open", "done")[self._state]
        return f"<ResponseStream {self.instance.path}/{self.instance_id:x} request={self.context.id} {state}>"


class Client:
    """Sends requests to the instances of one endpoint; returned by `Endpoint.client`.

    Example::

        client = await endpoint.client()
        await client.wait_for_instances(timeout=10)
        # [7598302...]
        [x async for x in client.round_robin({"text": "a b"})]
    """

    def __init__(
        self, endpoint: Endpoint, instances: InstanceSet, plane: RequestPlane, discovery: str
    ) -> None:
        self.endpoint = endpoint
        self._instances = instances
        self._plane = plane
        self._discovery = discovery
        self._next = 0
        self._down: dict[int, float] = {}
        #: which instances of the endpoint this client may use (None: all); a frontend sets it to
        #: the instances whose model card names the model it routes, since workers of other
        #: models may serve the same endpoint path
        self.serves: Callable[[int], bool] | None = None
        #: instances suspected of hanging (shared by a frontend's clients): skipped while another
        #: instance is usable, until cleared
        self.suspects: SuspectInstances | None = None
        instances.on_added(self._forget_down)

    def _forget_down(self, instance_id: int) -> None:
        self._down.pop(instance_id, None)  # it registered again: usable

    def instance_ids(self) -> list[int]:
        """Ids of the instances requests can go to now (not reported down; those `serves` allows)."""
        ids = self._instances.ids()
        if self.serves is not None:
            ids = [i for i in ids if self.serves(i)]
        if self._down:
            now = time.monotonic()
            for iid, until in list(self._down.items()):
                if until <= now:
                    del self._down[iid]
            if self._down:
                ids = [i for i in ids if i not in self._down]
        suspects = self.suspects
        if suspects:  # routed around while there is another; all suspect: better than none
            ids = [i for i in ids if i not in suspects] or ids
        return ids

    def healthy_ids(self) -> list[int]:
        """`instance_ids` without the suspect ones (empty when every instance is suspect)."""
        suspects = self.suspects
        ids = self.instance_ids()
        return [i for i in ids if i not in suspects] if suspects else ids

    def suspect_ids(self) -> list[int]:
        """Ids discovery lists that are suspected of hanging and routed around now."""
        suspects = self.suspects
        if not suspects:
            return []
        available = set(self.instance_ids())
        return [i for i in self._instances.ids() if i in suspects and i not in available]

    def down_ids(self) -> list[int]:
        """Ids discovery lists that were reported down and are skipped for a while (`DOWN_SECONDS`)."""
        if not self._down:
            return []
        available = set(self.instance_ids())
        return [i for i in self._instances.ids() if i in self._down and i not in available]

    def listed(self, instance_id: int) -> bool:
        """Whether discovery lists ``instance_id`` now (reported down, suspect or not)."""
        return self._instances.get(instance_id) is not None

    def instances(self) -> list[Instance]:
        """The instances with their transport details."""
        available = set(self.instance_ids())
        return [i for i in self._instances.all() if i.instance_id in available]

    async def wait_for_instances(self, timeout: float = 30.0) -> list[int]:
        """Wait until at least one instance serves the endpoint; return their ids.

        Raises `NoInstancesError` after ``timeout`` seconds. For a static endpoint (no
        discovery) this asks the address itself until something answers.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._instances.static:
            while True:
                remaining = deadline - loop.time()
                alive = [
                    i.instance_id
                    for i in self._instances.all()
                    if await self._plane.ping(i, max(min(remaining, 1.0), 0.05))
                ]
                if alive:
                    for iid in alive:
                        self._down.pop(iid, None)
                    return alive
                if loop.time() >= deadline:
                    break
                await asyncio.sleep(min(0.1, max(deadline - loop.time(), 0)))
        else:
            while True:
                ids = self.instance_ids()
                if ids:
                    return list(ids)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await self._instances.wait_changed(min(remaining, 1.0))
        raise NoInstancesError(
            no_instances_message(self.endpoint.path, self._discovery, timeout),
            endpoint=str(self.endpoint.path),
        )

    def _no_instances(self) -> NoInstancesError:
        return NoInstancesError(
            no_instances_message(self.endpoint.path, self._discovery)
            + " To wait for one, `await client.wait_for_instances(timeout=...)` first.",
            endpoint=str(self.endpoint.path),
        )

    def available_ids(self) -> list[int]:
        """`instance_ids`, or `NoInstancesError` (saying how to wait for one) when there is none.

        Example::

            ids = client.available_ids()  # what a router picks from
        """
        ids = self.instance_ids()
        if not ids:
            raise self._no_instances()
        return ids

    def next_instance(self) -> int:
        """The id of the next instance in turn (round robin); `NoInstancesError` when there is none."""
        ids = self.available_ids()
        instance_id = ids[self._next % len(ids)]
        self._next += 1
        return instance_id

    def random_instance(self) -> int:
        """The id of an instance drawn at random; `NoInstancesError` when there is none."""
        return _random.choice(self.available_ids())

    def round_robin(self, request: Any, *, context: Context | None = None) -> ResponseStream:
        """Send ``request`` to the next instance in turn."""
        return ResponseStream(self, self._instances.get(self.next_instance()), request, context)  # type: ignore[arg-type]  # the id was just drawn from the live instances

    def random(self, request: Any, *, context: Context | None = None) -> ResponseStream:
        """Send ``request`` to a random instance."""
        return ResponseStream(self, self._instances.get(self.random_instance()), request, context)  # type: ignore[arg-type]  # the id was just drawn from the live instances

    def direct(
        self, request: Any, instance_id: int | str, *, context: Context | None = None
    ) -> ResponseStream:
        """Send ``request`` to the instance ``instance_id`` (an int, or its hex string as READY
        lines and ``/health`` print it)."""
        instance_id = parse_instance_id(instance_id)
        instance = self._instances.get(instance_id)
        if instance is None:
            known = ", ".join(f"{i:x}" for i in self._instances.ids()) or "none"
            raise InstanceNotFoundError(
                f"instance {instance_id:x} does not serve {self.endpoint.path} (serving now: {known})",
                endpoint=str(self.endpoint.path),
                instance_id=instance_id,
            )
        return ResponseStream(self, instance, request, context)

    generate = round_robin

    def report_instance_down(self, instance_id: int) -> None:
        """Skip ``instance_id`` for a while (done for you when it fails in-band)."""
        if not self._instances.static:
            self._down[instance_id] = time.monotonic() + DOWN_SECONDS

    def report_instance_up(self, instance_id: int) -> None:
        """``instance_id`` answered again (a canary): it is no longer skipped as down."""
        self._down.pop(instance_id, None)

    def __repr__(self) -> str:
        return f"<Client {self.endpoint.path.url} instances={[f'{i:x}' for i in self.instance_ids()]}>"
