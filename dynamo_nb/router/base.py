"""The Router protocol: pick an instance for a request, open its stream there, hear when it ends.

Every router serves one endpoint through its `Client`:

- `pick(request) -> Route`: the instance for a `PreprocessedRequest` (`NoInstancesError` when
  there is none);
- `open(route, request)`: send it there; a router that keeps load per instance (the KV router)
  gets a `RoutedStream` that tells it when the first item came (`first_token`) and when the
  stream ended (`finished`); the others get the plain `ResponseStream`;
- `send(request)`: both.

`RoundRobinRouter` and `RandomRouter` use the client's own turn and draw (Dynamo's
``client.round_robin`` / ``client.random``), `DirectRouter` the request's
``routing.backend_instance_id``; `dynamo_nb.router.kv.KvRouter` weighs KV overlap against load,
and `dynamo_nb.router.prefill_planner.PrefillPlanner` routes the prefill half of disaggregated requests.

Example:
    >>> import asyncio
    >>> from dynamo_nb import DistributedRuntime
    >>> from dynamo_nb.engines import EchoEngine
    >>> from dynamo_nb.llm import PreprocessedRequest, engine_handler
    >>> async def main():
    ...     async with await DistributedRuntime.create() as rt:
    ...         endpoint = rt.endpoint("demo.echo.generate")
    ...         await endpoint.serve(engine_handler(EchoEngine().generate))
    ...         router = RoundRobinRouter(await endpoint.client())
    ...         request = PreprocessedRequest(token_ids=[5, 6])
    ...         route = router.pick(request)
    ...         items = [item async for item in router.open(route, request)]
    ...         return len(items), route.instance_id == rt.connection_id
    >>> asyncio.run(main())
    (16, True)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InvalidRequestError, RequestError
from ..llm.protocol import PreprocessedRequest
from ..runtime.planes.channel import NOT_READY
from .decision import NO_TICKET, Candidate, RoutingDecision, RoutingTicket

if TYPE_CHECKING:
    from ..runtime.client import ResponseStream
    from ..runtime.context import Context
    from .server_load import ServerLoads

__all__ = [
    "DirectRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "Route",
    "RoutedStream",
    "Router",
    "RoutingClient",
    "RoutingEndpoint",
]


class RoutingEndpoint(Protocol):
    """The endpoint a `RoutingClient` reaches: its path (printed in errors) and name."""

    @property
    def path(self) -> object: ...

    @property
    def name(self) -> str: ...


class RoutingClient(Protocol):
    """What a router calls on its endpoint's client: the instances (all, those with room, those
    reported down, those suspected of hanging), the client's turn and draw, and `direct` to send a routed request. The
    runtime's `dynamo_nb.runtime.Client` is one; a replay's simulated pool is another (it never
    sends: its routers only pick).

    Example::

        router = make_router("kv", client)   # any RoutingClient
    """

    @property
    def endpoint(self) -> RoutingEndpoint: ...

    def instance_ids(self) -> list[int]: ...

    def available_ids(self) -> list[int]: ...

    def down_ids(self) -> list[int]: ...

    def suspect_ids(self) -> list[int]: ...

    def next_instance(self) -> int: ...

    def random_instance(self) -> int: ...

    def direct(self, request: Any, instance_id: int, *, context: Context | None = None) -> ResponseStream: ...

    async def wait_for_instances(self, timeout: float = 30.0) -> list[int]: ...


@dataclass
class Route:
    """Where one request goes: the instance, the id the router tracks it by, and why
    (``decision``, a `RoutingDecision`)."""

    instance_id: int
    request_id: str = ""
    decision: RoutingDecision | None = field(default=None, kw_only=True)


class Router(ABC):
    """Routes the requests of one endpoint (see the module docstring).

    Attributes:
        client: the client of the endpoint it routes to.
        tracks_requests: whether it must hear of each request's first item and end (then
            `open` wraps the stream in a `RoutedStream`).
    """

    tracks_requests = False
    name = "router"  # what its routing decisions call it
    server_loads: ServerLoads | None = None
    """What the workers' own servers report (`dynamo_nb.router.server_load`), for routers that count load."""

    def __init__(self, client: RoutingClient) -> None:
        self.client = client

    def routed_to(self, instance_id: int) -> int:
        """Requests this router has in flight on ``instance_id`` (routers that count load say)."""
        return 0

    def follow_server_loads(self, loads: ServerLoads) -> None:
        """Add the load ``loads`` reports (what a worker's server runs that this router did not send)."""
        loads.routed_to = self.routed_to
        self.server_loads = loads

    def others_on(self, instance_id: int) -> int | None:
        """Requests ``instance_id``'s server runs or queues that this router did not send (None: it does not say)."""
        load = self.server_loads.get(instance_id) if self.server_loads is not None else None
        return None if load is None else load.others

    def decision(
        self,
        chosen: int,
        rule: str,
        candidates: list[Candidate] | None = None,
        *,
        ticket: RoutingTicket = NO_TICKET,
        **facts: Any,
    ) -> RoutingDecision:
        """The finished `RoutingDecision` for ``chosen``, filed under ``ticket``: ``candidates``
        (by default every available instance, unscored), then the instances skipped because they
        were reported down or are suspected of hanging; ``facts``: what else this router records (the KV router's
        ``overhead_ms``, ``seen_before_tokens``, ``policy``)."""
        if candidates is None:
            candidates = [Candidate(i) for i in self.client.instance_ids()]
        candidates.extend(Candidate(i, excluded="reported down") for i in self.client.down_ids())
        candidates.extend(Candidate(i, excluded="suspected of hanging") for i in self.client.suspect_ids())
        return RoutingDecision(
            self.name,
            chosen,
            candidates,
            rule,
            request_id=ticket.request_id,
            model=ticket.model,
            hop=ticket.hop,
            queue=ticket.queue,
            **facts,
        )

    @abstractmethod
    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        """The instance for ``request``, with the decision filed under ``ticket`` (its id, model,
        hop and queue); raises `NoInstancesError` when nobody serves the endpoint."""

    def first_token(self, route: Route) -> None:  # noqa: B027 - a router that keeps no load ignores it
        """The first item of the request ``route`` came back (its prefill is done)."""

    def finished(self, route: Route) -> None:  # noqa: B027
        """The request ``route`` ended (or failed)."""

    def open(
        self, route: Route, request: PreprocessedRequest, *, context: Context | None = None
    ) -> ResponseStream | RoutedStream:
        """Send ``request`` to ``route``'s instance; its stream."""
        try:
            stream = self.client.direct(request.to_dict(), route.instance_id, context=context)
        except BaseException:
            self.finished(route)
            raise
        return RoutedStream(stream, self, route) if self.tracks_requests else stream

    def send(
        self,
        request: PreprocessedRequest,
        *,
        context: Context | None = None,
        ticket: RoutingTicket = NO_TICKET,
    ) -> ResponseStream | RoutedStream:
        """`pick` and `open` in one."""
        return self.open(self.pick(request, ticket), request, context=context)

    async def stop(self) -> None:
        """Stop listening to whatever the router follows (KV events, the servers' loads)."""
        if self.server_loads is not None:
            await self.server_loads.stop()


class RoundRobinRouter(Router):
    """Each request to the next instance in turn (the client's turn, shared with ``client.round_robin``)."""

    name = "round-robin"

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        chosen = self.client.next_instance()
        return Route(chosen, decision=self.decision(chosen, "next in turn", ticket=ticket))


class RandomRouter(Router):
    """Each request to an instance drawn at random."""

    name = "random"

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        chosen = self.client.random_instance()
        return Route(chosen, decision=self.decision(chosen, "drawn at random", ticket=ticket))


class DirectRouter(Router):
    """Each request to the instance it names in ``routing.backend_instance_id`` (Dynamo's direct mode)."""

    name = "direct"

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        instance_id = (request.routing or {}).get("backend_instance_id")
        if not isinstance(instance_id, int) or isinstance(instance_id, bool):
            raise InvalidRequestError(
                f"direct routing needs routing.backend_instance_id, an instance id (int); got {instance_id!r}",
                param="backend_instance_id",
            )
        ids = self.client.instance_ids()
        candidates = [
            Candidate(i, excluded=None if i == instance_id else "the request named another instance")
            for i in ids
        ]
        if instance_id not in ids:
            candidates.append(Candidate(instance_id))
        rule = "named by the request (routing.backend_instance_id)"
        return Route(instance_id, decision=self.decision(instance_id, rule, candidates, ticket=ticket))


class RoutedStream:
    """A `ResponseStream` that tells its router when its first item came and when it ended."""

    __slots__ = ("_on_end", "_on_first", "_stream", "route")

    def __init__(self, stream: ResponseStream, router: Router, route: Route) -> None:
        self._stream = stream
        self.route = route
        self._on_first: Callable[[Route], None] | None = router.first_token
        self._on_end: Callable[[Route], None] | None = router.finished

    @property
    def instance_id(self) -> int:
        return self._stream.instance_id

    @property
    def context(self) -> Any:
        return self._stream.context

    @property
    def ready(self) -> int:
        """Items received and not read yet (`ResponseStream.ready`)."""
        return self._stream.ready

    def give_up(self, error: RequestError) -> None:
        """Stop waiting for it: the next read raises ``error`` (`ResponseStream.give_up`)."""
        self._stream.give_up(error)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    def next_ready(self) -> Any:
        """The next item if it has already arrived, else `NOT_READY` (`ResponseStream.next_ready`)."""
        item = self._stream.next_ready()
        if self._on_first is not None and item is not NOT_READY:
            self._on_first(self.route)
            self._on_first = None
        return item

    async def __anext__(self) -> Any:
        try:
            item = await self._stream.__anext__()
        except BaseException:
            self._end()
            raise
        if self._on_first is not None:
            self._on_first(self.route)
            self._on_first = None
        return item

    def _end(self) -> None:
        if self._on_end is not None:
            self._on_end(self.route)
            self._on_end = None

    async def aclose(self) -> None:
        """Stop the request (if still running); the router hears it ended."""
        self._end()
        await self._stream.aclose()
