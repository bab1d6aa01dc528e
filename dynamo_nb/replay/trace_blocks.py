"""A trace's prompts as KV blocks at an engine's block size, without token ids.

A trace names each prompt's blocks (``hash_ids``, at the trace's block size: Mooncake's 512,
ours 64); equal ids are equal blocks, so equal leading ids are a shared prefix. An engine with
a different block size sees the same prompt as blocks of its own size: each of its full
blocks is keyed by the trace blocks it covers and where it starts in the first, so two
prompts share exactly the engine blocks that cover their shared trace blocks. Tokens past the
trace's blocks (a length they do not cover) are keyed by position alone, as
`dynamo_nb.bench.trace_token_ids` fills them.

Example:
    >>> blocks = TraceBlocks(trace_block_size=64, block_size=16)
    >>> a, _ = blocks.hashes([7, 8], 128)
    >>> b, _ = blocks.hashes([7, 9], 128)
    >>> len(a), a[:4] == b[:4], a[4:] == b[4:]     # 8 blocks of 16; the first 4 shared
    (8, True, False)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError
from ..router.kv.hashing import sequence_hashes

__all__ = ["TraceBlocks"]

_MASK = (1 << 64) - 1
_UNCOVERED = -1  # the trace block id of tokens past the trace's blocks


class TraceBlocks:
    """Local and sequence block hashes of a trace's prompts at ``block_size`` (see the module docstring)."""

    def __init__(self, trace_block_size: int, block_size: int) -> None:
        if trace_block_size < 1 or block_size < 1:
            raise ConfigError(
                f"block sizes must be at least 1, got trace {trace_block_size} and engine {block_size}"
            )
        self.trace_block_size = trace_block_size
        self.block_size = block_size
        self._local: dict[tuple[int, ...], int] = {}

    def hashes(self, hash_ids: Sequence[int], input_length: int) -> tuple[list[int], list[int]]:
        """The prompt's full engine blocks: (local hashes, sequence hashes)."""
        size, trace_size = self.block_size, self.trace_block_size
        ids = list(hash_ids)
        cache = self._local
        local = []
        for i in range(input_length // size):
            start, end = i * size, (i + 1) * size - 1
            first, last = start // trace_size, end // trace_size
            covering = tuple(ids[j] if j < len(ids) else _UNCOVERED - j for j in range(first, last + 1))
            key = (start - first * trace_size, *covering)
            value = cache.get(key)
            if value is None:
                value = cache[key] = hash(key) & _MASK
            local.append(value)
        return local, sequence_hashes(local)
