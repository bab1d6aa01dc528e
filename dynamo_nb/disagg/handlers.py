"""Worker-side handlers of disaggregated serving: the decode handler's own prefill fallback.

A decode request normally arrives with ``bootstrap_info`` (the frontend's prefill router
chose the prefill worker and the room) or ``prefill_result`` (the router waited for the
prefill's ``disaggregated_params``). When it has neither — a frontend without a prefill
router, or a direct call — the decode handler asks a prefill worker itself, then decodes
from its KV cache. With no prefill worker reachable it generates the whole answer itself
(aggregated) and logs a warning.

Example:
    >>> prefill = await runtime.endpoint("dynamo.prefill.generate").client()     # doctest: +SKIP
    >>> handler = DecodeHandler(engine, prefill)                                 # doctest: +SKIP
    >>> await runtime.endpoint("dynamo.backend.generate").serve(handler.generate)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from .._context import Context
from ..errors import DisaggregationError, RequestError

if TYPE_CHECKING:
    from .._client import Client, ResponseStream

__all__ = ["DecodeHandler", "DisaggEngine"]

logger = logging.getLogger("dynamo_nb.disagg")


class DisaggEngine(Protocol):
    """An engine with the decode role (``HFEngine``, ``MockerEngine``): ``generate`` runs a whole
    request, ``decode`` goes on from a prefill's KV."""

    def generate(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]: ...

    def decode(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]: ...


class DecodeHandler:
    """Serves ``engine.decode``; asks ``prefill`` (a client of the prefill endpoint) when needed
    (with ``prefill`` None such requests are generated here).

    Attributes:
        self_prefills: requests it sent to a prefill worker itself.
        aggregated_fallbacks: requests it generated whole because no prefill worker could help.
    """

    def __init__(
        self, engine: DisaggEngine, prefill: Client | None, *, prefill_timeout: float = 30.0
    ) -> None:
        self.engine = engine
        self.prefill = prefill
        self.prefill_timeout = prefill_timeout
        self.self_prefills = 0
        self.aggregated_fallbacks = 0
        self._drains: set[asyncio.Task[None]] = set()

    async def generate(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The decode endpoint's handler."""
        own_prefill = request.get("bootstrap_info") is None and request.get("prefill_result") is None
        fallback: str | None = None
        if (request.get("extra_args") or {}).get("aggregated"):  # the frontend's router chose it
            async with contextlib.aclosing(self.engine.generate(request, context)) as items:
                async for item in items:
                    yield item
            return
        if own_prefill:
            try:
                params = await self._ask_prefill(request)
                request = {**request, "prefill_result": {"disaggregated_params": params}}
            except (RequestError, asyncio.TimeoutError) as exc:
                fallback = f"no prefill worker could take it ({exc})"
        if fallback is None:
            started = False
            try:
                async with contextlib.aclosing(self.engine.decode(request, context)) as items:
                    async for item in items:
                        started = True
                        yield item
                return
            except DisaggregationError as exc:
                if started or not own_prefill:
                    raise  # tokens went out, or the router chose this handoff: the failure goes back
                fallback = str(exc)
        async with contextlib.aclosing(self._aggregated(request, context, fallback)) as items:
            async for item in items:
                yield item

    async def _aggregated(
        self, request: dict[str, Any], context: Context | None, why: str
    ) -> AsyncIterator[dict[str, Any]]:
        self.aggregated_fallbacks += 1
        logger.warning("generating a request here, without a prefill worker: %s", why)
        clean = {k: v for k, v in request.items() if k not in ("prefill_result", "bootstrap_info")}
        async with contextlib.aclosing(self.engine.generate(clean, context)) as items:
            async for item in items:
                yield item

    async def _ask_prefill(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send the prefill (max_tokens 1) and wait for its ``disaggregated_params``."""
        if self.prefill is None:
            raise DisaggregationError("this decode worker has no client for the prefill endpoint")
        stop = dict(request.get("stop_conditions") or {})
        stop["max_tokens"] = 1
        prefill_request = {**request, "stop_conditions": stop}
        stream = self.prefill.round_robin(prefill_request)  # NoInstancesError: nobody serves prefill
        self.self_prefills += 1
        try:
            first = await asyncio.wait_for(stream.__anext__(), self.prefill_timeout)
        except StopAsyncIteration:
            raise DisaggregationError("the prefill worker ended its stream without output") from None
        params = first.get("disaggregated_params") if isinstance(first, dict) else None
        if params is None:
            await stream.aclose()
            raise DisaggregationError("the prefill worker's first item had no disaggregated_params")
        self._drain(stream)
        return params

    def _drain(self, stream: ResponseStream) -> None:
        """Read the rest of the prefill stream in the background; log its failure."""

        async def drain() -> None:
            try:
                async for _ in stream:
                    pass
            except RequestError as exc:
                logger.warning("prefill stream failed after its disaggregated_params: %s", exc)

        task = asyncio.get_running_loop().create_task(drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
