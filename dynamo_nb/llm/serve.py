"""Serve an engine's handler and register its model: the two steps every LLM worker takes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._server import EndpointServer, Handler
from .card import ModelCard, ModelRuntimeConfig, card_from_folder, publish_card

if TYPE_CHECKING:
    from ..runtime import Endpoint

__all__ = ["serve_llm"]


async def serve_llm(
    endpoint: Endpoint,
    handler: Handler,
    model_path: str | Path,
    *,
    model_name: str | None = None,
    kind: list[str] | str | None = None,
    kv_cache_block_size: int = 16,
    runtime_config: ModelRuntimeConfig | dict[str, Any] | None = None,
) -> tuple[EndpointServer, ModelCard]:
    """Serve ``handler`` at ``endpoint`` and publish its model card (not with static discovery).

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
    )
    server = await endpoint.serve(handler)
    try:
        await publish_card(endpoint, card)
    except BaseException:
        await server.stop(grace=0)
        raise
    return server, card
