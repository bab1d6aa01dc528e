"""Dynamo's KV block hashes: what routers and workers agree a cached prefix is.

Token ids are cut into full blocks of ``block_size`` (a partial tail block never counts).
Each block's *local hash* is XXH3-64 with seed 1337 over its token ids as little-endian u32;
the *sequence hash* chains them: ``seq[0] = local[0]``, ``seq[i] = XXH3-64(LE64(seq[i-1]) ‖
LE64(local[i]))`` with the same seed. Two requests share a cached prefix of ``k`` blocks
exactly when their first ``k`` local hashes agree.

Example:
    >>> hashes = block_hashes(list(range(40)), block_size=16)   # 2 full blocks; 8 tokens left over
    >>> len(hashes), len(sequence_hashes(hashes))
    (2, 2)
    >>> block_hashes([1, 2, 3], block_size=16)
    []
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

from ...errors import ConfigError

__all__ = ["HASH_SEED", "block_hashes", "sequence_hashes"]

HASH_SEED = 1337
_MASK = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")


def _seed(lora_name: str | None) -> int:
    if not lora_name:
        return HASH_SEED
    return (HASH_SEED + xxhash.xxh3_64_intdigest(lora_name.encode())) & _MASK


def block_hashes(tokens: Sequence[int], block_size: int, *, lora_name: str | None = None) -> list[int]:
    """The local hash of every full block of ``tokens`` (XXH3-64, seed 1337, LE u32 tokens)."""
    if block_size < 1:
        raise ConfigError(f"block_size must be at least 1, got {block_size}")
    seed = _seed(lora_name)
    full = len(tokens) - len(tokens) % block_size
    if not full:
        return []
    data = memoryview(struct.pack(f"<{full}I", *tokens[:full]))  # every full block's bytes at once
    digest = xxhash.xxh3_64_intdigest
    step = 4 * block_size
    return [digest(data[start : start + step], seed=seed) for start in range(0, 4 * full, step)]


def sequence_hashes(
    local_hashes: Sequence[int], *, lora_name: str | None = None, parent: int | None = None
) -> list[int]:
    """The chained sequence hash of each block: a block's identity together with its prefix.

    ``parent`` is the sequence hash of the block before the first one (None: they start the prompt).

    Example:
        >>> whole = sequence_hashes([1, 2, 3])
        >>> sequence_hashes([2, 3], parent=whole[0]) == whole[1:]
        True
    """
    if not local_hashes:
        return []
    seed = _seed(lora_name)
    digest, pack = xxhash.xxh3_64_intdigest, _PAIR.pack
    chained = []
    last = parent
    for local in local_hashes:
        last = local if last is None else digest(pack(last, local), seed=seed)
        chained.append(last)
    return chained
