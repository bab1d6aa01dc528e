"""A zero-cost engine: streams the prompt's tokens back, for measuring everything but the model.

Example:
    >>> import asyncio
    >>> from dynamo_nb.llm import PreprocessedRequest, StopConditions
    >>> async def run():
    ...     request = PreprocessedRequest(token_ids=[7, 8], stop_conditions=StopConditions(max_tokens=3))
    ...     return [output.token_ids async for output in EchoEngine().generate(request)]
    >>> asyncio.run(run())
    [[7], [8], [7]]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from .base import KvEvent, token_budget

__all__ = ["EchoEngine"]


class EchoEngine:
    """Yields ``max_tokens`` tokens (default 16), cycling through the prompt, one per item."""

    def __init__(self, context_length: int | None = None) -> None:
        self.context_length = context_length
        self.requests_total = 0
        self.active = 0  # streams open now

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The prompt's tokens, cycled, one per item; the last with usage. It lets other tasks
        run between items (as a real engine between steps), so concurrent streams interleave."""
        self.requests_total += 1
        prompt = request.token_ids
        budget = token_budget(request, self.context_length)
        self.active += 1
        try:
            for index in range(budget - 1):
                if context is not None and context.is_stopped():
                    yield LLMEngineOutput.final(
                        [], "cancelled", prompt_tokens=len(prompt), completion_tokens=index
                    )
                    return
                yield LLMEngineOutput([prompt[index % len(prompt)]])
                await asyncio.sleep(0)
            last = prompt[(budget - 1) % len(prompt)]
            yield LLMEngineOutput.final([last], "length", prompt_tokens=len(prompt), completion_tokens=budget)
        finally:
            self.active -= 1

    def stats(self) -> dict[str, int]:
        """``requests``: how many it served."""
        return {"requests": self.requests_total}

    def kv_snapshot(self) -> list[KvEvent]:
        """No KV cache: nothing to rebuild."""
        return []

    async def close(self) -> None:
        """Nothing to release."""
