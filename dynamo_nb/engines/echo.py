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

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from .base import KvEvent, KvEventSink, token_budget

__all__ = ["EchoEngine"]


class EchoEngine:
    """Yields ``max_tokens`` tokens (default `DEFAULT_MAX_TOKENS`, 16), cycling through the prompt, one per item.

    Attributes:
        context_length: the longest prompt + output it serves (None: any).
        max_num_seqs: None: no limit. block_size: None: no KV cache.
        active: streams open now.
    """

    max_num_seqs: int | None = None
    block_size: int | None = None

    def __init__(self, context_length: int | None = None) -> None:
        self.context_length = context_length
        self.requests_total = 0
        self.active = 0

    @classmethod
    async def from_args(
        cls,
        args: argparse.Namespace,
        model_path: str | Path | None = None,
        *,
        kv_events: KvEventSink | None = None,
    ) -> EchoEngine:
        """The echo engine (it reads no flag, holds no model and sends no KV event)."""
        return cls()

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
                        [], "cancelled", prompt_tokens=len(prompt), completion_tokens=index, cached_tokens=0
                    )
                    return
                yield LLMEngineOutput([prompt[index % len(prompt)]])
                await asyncio.sleep(0)
            last = prompt[(budget - 1) % len(prompt)]
            yield LLMEngineOutput.final(
                [last], "length", prompt_tokens=len(prompt), completion_tokens=budget, cached_tokens=0
            )
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
