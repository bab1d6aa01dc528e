"""The decode worker's handler: decode from a prefill's KV, asking a prefill worker itself when needed.

A decode request normally arrives with ``bootstrap_info`` (the frontend's prefill router
chose the prefill worker and the room) or ``prefill_result`` (the router waited for the
prefill's ``disaggregated_params``). When it has neither — a frontend without a prefill
router, or a direct call — the decode handler asks a prefill worker itself (the same
`dynamo_nb.disagg.handoff` steps the router takes), then decodes from its KV cache. With no
prefill worker reachable it generates the whole answer itself (aggregated) and logs a warning.

Example::

    prefill = await runtime.endpoint("dynamo.prefill.generate").client()
    handler = DecodeHandler(engine, prefill)
    await runtime.endpoint("dynamo.backend.generate").serve(engine_handler(handler.generate))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import DisaggregationError, RequestError
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from . import handoff
from .roles import DisaggregatedEngine

if TYPE_CHECKING:
    from ..llm.register import EngineMethod
    from ..runtime.client import Client

__all__ = ["DecodeHandler"]

logger = logging.getLogger("dynamo_nb.disagg")


class DecodeHandler:
    """Serves ``engine.decode``; asks ``prefill`` (a client of the prefill endpoint) when needed
    (with ``prefill`` None such requests are generated here).

    Attributes:
        self_prefills: requests it sent to a prefill worker itself.
        aggregated_fallbacks: requests it generated whole because no prefill worker could help.
    """

    def __init__(
        self, engine: DisaggregatedEngine, prefill: Client | None, *, prefill_timeout: float = 30.0
    ) -> None:
        self.engine = engine
        self.prefill = prefill
        self.prefill_timeout = prefill_timeout
        self.self_prefills = 0
        self.aggregated_fallbacks = 0

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode endpoint's method (serve it with `dynamo_nb.engines.engine_handler`)."""
        if (request.extra_args or {}).get("aggregated"):  # the frontend's router chose it
            async with contextlib.aclosing(self.engine.generate(request, context)) as outputs:
                async for output in outputs:
                    yield output
            return
        own_prefill = request.bootstrap_info is None and request.prefill_result is None
        fallback: str | None = None
        if own_prefill:
            try:
                request = await self._ask_prefill(request)
            except RequestError as exc:
                fallback = f"no prefill worker could take it ({exc})"
        if fallback is None:
            started = False
            try:
                async with contextlib.aclosing(self.engine.decode(request, context)) as outputs:
                    async for output in outputs:
                        started = True
                        yield output
                return
            except DisaggregationError as exc:
                if started or not own_prefill:
                    raise  # tokens went out, or the router chose this handoff: the failure goes back
                fallback = str(exc)
        async with contextlib.aclosing(self._aggregated(request, context, fallback)) as outputs:
            async for output in outputs:
                yield output

    async def _aggregated(
        self, request: PreprocessedRequest, context: Context | None, why: str
    ) -> AsyncIterator[LLMEngineOutput]:
        self.aggregated_fallbacks += 1
        logger.warning("generating a request here, without a prefill worker: %s", why)
        whole = dataclasses.replace(request, prefill_result=None, bootstrap_info=None)
        generate: EngineMethod = self.engine.generate
        async with contextlib.aclosing(generate(whole, context)) as outputs:
            async for output in outputs:
                yield output

    async def _ask_prefill(self, request: PreprocessedRequest) -> PreprocessedRequest:
        """Send the prefill, wait for its ``disaggregated_params``: the request to decode with them."""
        if self.prefill is None:
            raise DisaggregationError("this decode worker has no client for the prefill endpoint")
        stream = self.prefill.round_robin(handoff.prefill_request(request).to_dict())  # NoInstancesError
        self.self_prefills += 1
        try:
            params = await handoff.await_params(stream, self.prefill_timeout)
        except BaseException:
            await stream.aclose()
            raise
        handoff.drain(stream, what="the prefill stream after its disaggregated_params")
        return dataclasses.replace(request, prefill_result={"disaggregated_params": params})
