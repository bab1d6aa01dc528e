"""A router from a plain function: routing logic written in a notebook cell.

``pick(request, instance_ids) -> instance_id`` sees the `PreprocessedRequest` (its token ids,
sampling and stop settings) and the ids of the instances that can take it now (none
reported down), and returns one of them; `FunctionRouter` turns it into a `Router` a frontend
uses (`Frontend.set_router`). A function that raises, or returns an id that is not among
them, fails that request with a 500 that says so; the frontend goes on serving.

Example:
    >>> import asyncio
    >>> from dynamo_nb import DistributedRuntime
    >>> from dynamo_nb.engines import EchoEngine
    >>> from dynamo_nb.llm import PreprocessedRequest, engine_handler
    >>> def longest_first(request, instance_ids):
    ...     return max(instance_ids) if len(request.token_ids) > 100 else min(instance_ids)
    >>> async def main():
    ...     async with await DistributedRuntime.create() as rt:
    ...         endpoint = rt.endpoint("demo.fn.generate")
    ...         await endpoint.serve(engine_handler(EchoEngine().generate))
    ...         router = FunctionRouter(await endpoint.client(), longest_first)
    ...         return router.pick(PreprocessedRequest(token_ids=[5])).instance_id == rt.connection_id
    >>> asyncio.run(main())
    True
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import RoutingError
from ..llm.protocol import PreprocessedRequest
from ..runtime.instance import format_instance_id, parse_instance_id
from .base import Route, Router, RoutingClient
from .decision import NO_TICKET, RoutingTicket

__all__ = ["FunctionRouter", "PickFunction"]

PickFunction = Callable[[PreprocessedRequest, list[int]], int | str]


class FunctionRouter(Router):
    """Routes with ``pick(request, instance_ids) -> instance_id`` (see the module docstring).

    Attributes:
        function: the routing function.
        picks: how many requests it routed, per instance id.
    """

    def __init__(self, client: RoutingClient, function: PickFunction) -> None:
        super().__init__(client)
        self.function = function
        self.function_name: str = getattr(function, "__name__", repr(function))
        self.name = f"policy:{self.function_name}"  # what its decisions call it
        self.picks: dict[int, int] = {}

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        ids = self.client.available_ids()
        name = self.function_name
        try:
            chosen = self.function(request, list(ids))
        except Exception as exc:
            hint = ""
            if isinstance(exc, TypeError) and "PreprocessedRequest" in str(exc):
                hint = (
                    ": the request is a PreprocessedRequest, not a dict; read its attributes "
                    "(request.token_ids, request.stop_conditions.max_tokens, request.routing …)"
                )
            raise RoutingError(
                f"the routing function {name} raised {type(exc).__name__}: {exc}{hint}"
            ) from exc
        returned = chosen
        try:  # an int, or the hex string people read (READY lines, /health)
            chosen = parse_instance_id(chosen)
        except ValueError:
            pass
        if chosen not in ids:
            raise RoutingError(
                f"the routing function {name} returned {returned!r}, not one of the instances "
                f"{[format_instance_id(i) for i in ids]} (an int, or its hex string)"
            )
        self.picks[chosen] = self.picks.get(chosen, 0) + 1
        return Route(
            chosen, decision=self.decision(chosen, f"returned by your function {name}", ticket=ticket)
        )
