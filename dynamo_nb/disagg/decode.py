"""The decode side of disaggregated serving: where a decode fetches its KV, and the decode
worker's handler.

`fetch_prompt_kv` is the decode role's fetch: where the KV is (`bootstrap_of`: the request's
``bootstrap_info``, else its ``prefill_result``), the KV itself from the prefill's bootstrap
server (`dynamo_nb.disagg.bootstrap.fetch_kv`), checked against the prompt. The prefill side is
`dynamo_nb.disagg.prefill`.

A decode request normally arrives with ``bootstrap_info`` (the frontend's prefill planner
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

import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..errors import DisaggregationError, RequestError
from ..llm.bootstrap_info import BootstrapInfo
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from ..runtime.streams import closing
from ..telemetry.tracing import span
from . import handoff
from .bootstrap import fetch_kv
from .roles import DisaggregatedEngine

if TYPE_CHECKING:
    from ..llm.register import EngineMethod
    from ..runtime.client import Client

__all__ = ["DecodeHandler", "bootstrap_of", "fetch_prompt_kv"]

logger = logging.getLogger("dynamo_nb.disagg")


def bootstrap_of(request: PreprocessedRequest) -> BootstrapInfo:
    """Where a decode request's KV is: ``bootstrap_info``, else ``prefill_result``'s bootstrap room."""
    if request.bootstrap_info is not None:
        return request.bootstrap_info
    result = request.prefill_result
    if result is not None and result.bootstrap is not None:
        return result.bootstrap
    if result is not None:
        raise DisaggregationError(
            "this engine fetches its KV from a bootstrap server, but the prefill sent an engine's own "
            "kv_transfer_params: serve prefill and decode with the same engine"
        )
    raise DisaggregationError(
        "a decode request needs bootstrap_info (fast path) or prefill_result.disaggregated_params "
        "(fallback path); neither was sent"
    )


async def fetch_prompt_kv(request: PreprocessedRequest, timeout: float) -> tuple[dict[str, Any], bytes]:
    """The decode role's KV header and payload, from the prefill's bootstrap server; refuses the
    KV of another prompt."""
    info = bootstrap_of(request)
    with span("kv handoff", {"bootstrap_room": info.room}):
        header, payload = await fetch_kv(info, timeout=timeout)
    if header.get("prompt_tokens") != len(request.token_ids):
        raise DisaggregationError(
            f"room {info.room} holds the KV of {header.get('prompt_tokens')} prompt tokens, "
            f"but this request has {len(request.token_ids)}: prefill and decode got different prompts"
        )
    return header, payload


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
        """The decode endpoint's method (serve it with `dynamo_nb.llm.engine_handler`)."""
        if (request.extra_args or {}).get("aggregated"):  # the frontend's router chose it
            async with closing(self.engine.generate(request, context)) as outputs:
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
                async with closing(self.engine.decode(request, context)) as outputs:
                    async for output in outputs:
                        started = True
                        yield output
                return
            except DisaggregationError as exc:
                if started or not own_prefill:
                    raise  # tokens went out, or the router chose this handoff: the failure goes back
                fallback = str(exc)
        async with closing(self._aggregated(request, context, fallback)) as outputs:
            async for output in outputs:
                yield output

    async def _aggregated(
        self, request: PreprocessedRequest, context: Context | None, why: str
    ) -> AsyncIterator[LLMEngineOutput]:
        self.aggregated_fallbacks += 1
        logger.warning("generating a request here, without a prefill worker: %s", why)
        whole = dataclasses.replace(request, prefill_result=None, bootstrap_info=None)
        generate: EngineMethod = self.engine.generate
        async with closing(generate(whole, context)) as outputs:
            async for output in outputs:
                yield output

    async def _ask_prefill(self, request: PreprocessedRequest) -> PreprocessedRequest:
        """Send the prefill, wait for its ``disaggregated_params``: the request to decode with them."""
        if self.prefill is None:
            raise DisaggregationError("this decode worker has no client for the prefill endpoint")
        stream = self.prefill.round_robin(handoff.prefill_request(request).to_dict())  # NoInstancesError
        self.self_prefills += 1
        try:
            result = await handoff.await_params(stream, self.prefill_timeout)
        except BaseException:
            await stream.aclose()
            raise
        handoff.drain(stream, what="the prefill stream after its disaggregated_params")
        return dataclasses.replace(request, prefill_result=result)
