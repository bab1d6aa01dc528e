"""A zero-cost engine: streams the prompt's tokens back, for measuring everything but the model.

Example:
    >>> import asyncio
    >>> async def run():
    ...     engine = EchoEngine()
    ...     return [item async for item in engine.generate({"token_ids": [7, 8], "stop_conditions": {"max_tokens": 3}})]
    >>> [item["token_ids"] for item in asyncio.run(run())]
    [[7], [8], [7]]
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .._context import Context
from ..llm.protocol import PreprocessedRequest
from ._base import final_item, token_budget

__all__ = ["EchoEngine"]


class EchoEngine:
    """Yields ``max_tokens`` tokens (default 16), cycling through the prompt, one per item."""

    def __init__(self, context_length: int | None = None) -> None:
        self.context_length = context_length

    async def generate(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The engine's handler: serve it with ``endpoint.serve(engine.generate)``."""
        parsed = PreprocessedRequest.from_dict(request)
        prompt = parsed.token_ids
        budget = token_budget(parsed, self.context_length)
        for index in range(budget - 1):
            if context is not None and context.is_stopped():
                yield final_item([], "cancelled", len(prompt), index)
                return
            yield {"token_ids": [prompt[index % len(prompt)]]}
        yield final_item([prompt[(budget - 1) % len(prompt)]], "length", len(prompt), budget)
