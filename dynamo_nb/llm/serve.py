"""Serve an engine's handler and register its model: the two steps every LLM worker takes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._context import Context
from .._server import EndpointServer, Handler, adapt_handler
from ..errors import DynamoNBError
from .card import ModelCard, ModelRuntimeConfig, card_from_folder, publish_card

if TYPE_CHECKING:
    from ..runtime import Endpoint

__all__ = ["ReadinessGate", "serve_llm"]


class ReadinessGate:
    """Holds the requests that reach a worker before its registration is complete.

    The endpoint serves at once, so it is reachable while its model card is still being
    published; a request that comes in that window waits (at most ``timeout`` seconds) for
    `open` instead of being refused or lost.

    Example:
        >>> gate = ReadinessGate(engine.generate)                  # doctest: +SKIP
        >>> server = await endpoint.serve(gate.handle)             # doctest: +SKIP
        >>> await register_llm(endpoint, model_path); gate.open()  # doctest: +SKIP
    """

    def __init__(self, handler: Handler, timeout: float = 30.0) -> None:
        self._call = adapt_handler(handler)
        self._ready = asyncio.Event()
        self.timeout = timeout
        self.held_total = 0

    @property
    def is_open(self) -> bool:
        return self._ready.is_set()

    def open(self) -> None:
        """Registration is done: let held and new requests through."""
        self._ready.set()

    async def handle(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """The handler to serve: waits for `open`, then runs the wrapped handler."""
        if not self._ready.is_set():
            self.held_total += 1
            try:
                await asyncio.wait_for(self._ready.wait(), self.timeout)
            except asyncio.TimeoutError:
                raise DynamoNBError(
                    f"this worker's registration did not complete within {self.timeout:g} s; retry later"
                ) from None
        async with contextlib.aclosing(self._call(request, context)) as items:  # closed with this stream
            async for item in items:
                yield item


async def serve_llm(
    endpoint: Endpoint,
    handler: Handler,
    model_path: str | Path,
    *,
    model_name: str | None = None,
    kind: list[str] | str | None = None,
    kv_cache_block_size: int = 16,
    runtime_config: ModelRuntimeConfig | dict[str, Any] | None = None,
    context_length: int | None = None,
) -> tuple[EndpointServer, ModelCard]:
    """Serve ``handler`` at ``endpoint`` and publish its model card (not with static discovery).

    ``context_length`` overrides the model config's (an engine such as the mocker may take longer prompts).

    The endpoint serves first, behind a `ReadinessGate`: a request that reaches it before the
    card is published waits for the registration instead of being refused.

    Example:
        >>> engine = await HFEngine.load(tiny_model_path())                                # doctest: +SKIP
        >>> server, card = await serve_llm(endpoint, engine.generate, tiny_model_path(), model_name="tiny")  # doctest: +SKIP
    """
    # the card is built (and the folder checked) before serving, so a bad path publishes nothing
    card = card_from_folder(
        model_path,
        name=model_name,
        endpoint=str(endpoint.path),
        kinds=kind,
        kv_cache_block_size=kv_cache_block_size,
        runtime_config=runtime_config,
        context_length=context_length,
    )
    gate = ReadinessGate(handler)  # requests that come before the card is out wait for it
    server = await endpoint.serve(gate.handle)
    try:
        await publish_card(endpoint, card)
    except BaseException:
        await server.stop(grace=0)
        raise
    gate.open()
    return server, card
