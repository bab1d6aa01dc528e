"""What every engine shares: request admission limits and the items it streams."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError
from ..llm.protocol import PreprocessedRequest

__all__ = ["final_item", "token_budget"]


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


def final_item(
    token_ids: list[int], finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The last stream item: its tokens, why the stream ended, and the usage."""
    return {
        "token_ids": token_ids,
        "finish_reason": finish_reason,
        "completion_usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
