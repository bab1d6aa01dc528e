"""What every engine shares: request admission limits and the items it streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import InvalidRequestError
from ..llm.protocol import PreprocessedRequest, final_item

__all__ = ["final_item", "stats_handler", "token_budget"]


def token_budget(request: PreprocessedRequest, context_length: int | None) -> int:
    """How many tokens ``request`` may generate: its ``max_tokens``, capped by the context left.

    Raises `InvalidRequestError` when the prompt alone fills the context.

    Example:
        >>> token_budget(PreprocessedRequest(token_ids=[1, 2, 3]), context_length=8)
        5
    """
    prompt = len(request.token_ids)
    asked = request.stop_conditions.max_tokens
    if context_length is None:
        return asked if asked is not None else 16
    room = context_length - prompt
    if room < 1:
        raise InvalidRequestError(
            f"the prompt is {prompt} tokens and the model's context is {context_length}: shorten the prompt",
            param="messages",
        )
    return room if asked is None else min(asked, room)


def stats_handler(stats: Callable[[], dict[str, Any]]) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    """An endpoint handler answering with ``stats()`` (an engine's counters, such as prefix hits).

    Example:
        >>> await component.endpoint("stats").serve(stats_handler(engine.stats))   # doctest: +SKIP
    """

    async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        yield stats()

    return handler
