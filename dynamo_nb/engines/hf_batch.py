"""The hf engine's decoding sequences as one batch that lives across steps (continuous batching:
sequences join and leave between steps).

A `DecodeBatch` holds the KV caches of its members stacked into one ``DynamicCache``, each row
left-padded to the longest, with an attention mask that hides the padding and each row's own
positions. A step runs the model once for every member and the cache grows in place, so the
caches are restacked only when the members change. A member's logits do not depend on what it
was batched with: padded keys are masked out exactly (their weight is zero) and every row keeps
its own positions.
"""

from __future__ import annotations

from typing import Any

from .model_calls import forward_with_cache

__all__ = ["DecodeBatch", "can_batch"]


def can_batch(caches: list[Any]) -> bool:
    """Whether these caches can share a step: plain full-attention layers (no sliding windows,
    no quantized or static layers), one sequence each.

    Example::

        if can_batch([seq.cache for seq in decoding]): ...
    """
    for cache in caches:
        for layer in getattr(cache, "layers", None) or [None]:
            if type(layer).__name__ != "DynamicLayer" or layer.keys is None or layer.keys.shape[0] != 1:
                return False
    return True


class DecodeBatch:
    """Decoding sequences whose caches stay stacked between steps.

    Example::

        batch = DecodeBatch(model)
        batch.rebuild([7, 9], [cache_7, cache_9])  # sequence ids and their own caches
        logits = batch.step([last_token_7, last_token_9])  # one row each, in `ids` order
        cache_7 = batch.cache_of(7)  # its cache again (views into the batch), e.g. to run alone
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ids: list[int] = []  # the members, in row order
        self._cache: Any = None
        self._mask: Any = None  # (rows, positions): 1 where a row has a real position
        self._lengths: Any = None  # (rows, 1): each row's own length, its next position

    def rebuild(self, ids: list[int], caches: list[Any]) -> None:
        """Make ``ids`` (with their own ``caches``, see `can_batch`) the members, in that order."""
        import torch
        from transformers import DynamicCache

        lengths = [cache.get_seq_length() for cache in caches]
        longest = max(lengths)
        stacked = [
            (
                _stack_left_padded([cache.layers[index].keys for cache in caches], lengths, longest),
                _stack_left_padded([cache.layers[index].values for cache in caches], lengths, longest),
            )
            for index in range(len(caches[0].layers))
        ]
        device = stacked[0][0].device
        self._cache = DynamicCache(ddp_cache_data=stacked, config=self.model.config)
        self._mask = torch.zeros((len(caches), longest), dtype=torch.long, device=device)
        for row, length in enumerate(lengths):
            self._mask[row, longest - length :] = 1
        self._lengths = torch.tensor([[length] for length in lengths], device=device)
        self.ids = list(ids)

    def step(self, last_tokens: list[int]) -> Any:
        """One decode step of every member: the last position's logits, one row per member."""
        import torch

        ones = self._mask.new_ones((len(self.ids), 1))
        self._mask = torch.cat([self._mask, ones], dim=1)
        logits = forward_with_cache(
            self.model,
            self._cache,
            input_ids=torch.tensor([[token] for token in last_tokens], device=self._mask.device),
            attention_mask=self._mask,
            position_ids=self._lengths,
        ).logits[:, -1]
        self._lengths = self._lengths + 1
        return logits

    def cache_of(self, seq_id: int) -> Any:
        """A member's own cache (views into the batch, without the padding)."""
        from transformers import DynamicCache

        row = self.ids.index(seq_id)
        start = self._mask.shape[1] - int(self._lengths[row, 0])
        layers = [
            (layer.keys[row : row + 1, :, start:], layer.values[row : row + 1, :, start:])
            for layer in self._cache.layers
        ]
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def clear(self) -> None:
        """No members (the stacked cache is freed)."""
        self.ids, self._cache, self._mask, self._lengths = [], None, None, None


def _stack_left_padded(tensors: list[Any], lengths: list[int], longest: int) -> Any:
    """One (batch, heads, ``longest``, dim) tensor from single-sequence ``tensors``, each
    right-aligned (zeros before its first position), in one copy."""
    first = tensors[0]
    out = first.new_zeros((len(tensors), first.shape[1], longest, first.shape[3]))
    for row, (tensor, length) in enumerate(zip(tensors, lengths, strict=True)):
        out[row, :, longest - length :] = tensor[0]
    return out
