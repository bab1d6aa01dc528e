"""The hf engine's decoding sequences as one batch that lives across steps (continuous batching:
sequences join and leave between steps).

A `DecodeBatch` holds the KV caches of its members stacked into one ``DynamicCache``, each row
left-padded to the longest, with an attention mask that hides the padding and each row's own
positions. A step runs the model once for every member and the cache grows in place; when the
members change, only the joining ones are copied in. A member's logits do not depend on what it
was batched with: padded keys are masked out exactly (their weight is zero) and every row keeps
its own positions.
"""

from __future__ import annotations

from typing import Any

from .model_calls import forward_with_cache, logits_at

__all__ = ["DecodeBatch", "can_batch", "row_cache", "stack_left_padded"]


def can_batch(caches: list[Any]) -> bool:
    """Whether these caches can share a step: plain full-attention layers (no sliding windows,
    no quantized or static layers), one sequence each; an empty layer (nothing run yet) stacks as
    padding.

    Example::

        if can_batch([seq.cache for seq in decoding]): ...
    """
    for cache in caches:
        for layer in getattr(cache, "layers", None) or [None]:
            if type(layer).__name__ != "DynamicLayer" or (
                layer.keys is not None and layer.keys.shape[0] != 1
            ):
                return False
    return True


class DecodeBatch:
    """Decoding sequences whose caches stay stacked between steps.

    A join copies only the joining sequences' KV into the batch (and a leave copies nothing
    per member: the rows that stay are selected in one copy per layer), so the cost of a
    member changing does not grow with the members that stay. Row lengths are kept on the host
    too, so nothing here waits for the device.

    Example::

        batch = DecodeBatch(model)
        batch.update(set(), [(7, cache_7), (9, cache_9)])  # sequence ids joining, with their own caches
        logits = batch.step([last_token_7, last_token_9])  # one row each, in `ids` order
        batch.update({9}, [])                              # 7 left
        cache_9 = batch.cache_of(9)  # its cache again (views into the batch), e.g. to run alone
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ids: list[int] = []  # the members, in row order
        self.joined_rows = 0  # rows copied in by joins (a measure of what membership changes cost)
        self._cache: Any = None
        self._mask: Any = None  # (rows, positions): 1 where a row has a real position
        self._lengths: Any = None  # (rows, 1): each row's own length, its next position
        self._host_lengths: list[int] = []

    def update(self, keep: set[int], joining: list[tuple[int, Any]]) -> None:
        """The members in ``keep`` stay (in their order), the others leave, and ``joining``
        (sequence ids with their own caches, see `can_batch`) join after them."""
        rows = [row for row, seq_id in enumerate(self.ids) if seq_id in keep]
        if len(rows) < len(self.ids):
            self._select(rows)
        if joining:
            self._join(joining)

    def _select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (one copy per tensor), dropping the columns no row uses any more."""
        import torch

        if not rows:
            self.clear()
            return
        index = torch.tensor(rows, device=self._mask.device)
        lengths = [self._host_lengths[row] for row in rows]
        start = self._mask.shape[1] - max(lengths)
        layers = [
            (
                layer.keys.index_select(0, index)[:, :, start:],
                layer.values.index_select(0, index)[:, :, start:],
            )
            for layer in self._cache.layers
        ]
        self._set(
            [self.ids[row] for row in rows],
            layers,
            self._mask.index_select(0, index)[:, start:],
            self._lengths.index_select(0, index),
            lengths,
        )

    def _join(self, joining: list[tuple[int, Any]]) -> None:
        import torch

        lengths = [cache.get_seq_length() for _, cache in joining]
        width = max([self._mask.shape[1] if self.ids else 0, *lengths])
        caches = [cache for _, cache in joining]
        new_layers = [
            (
                stack_left_padded([cache.layers[index].keys for cache in caches], lengths, width),
                stack_left_padded([cache.layers[index].values for cache in caches], lengths, width),
            )
            for index in range(len(caches[0].layers))
        ]
        device = new_layers[0][0].device
        new_mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], device=device)
        new_lengths = torch.tensor([[n] for n in lengths], device=device)
        self.joined_rows += len(joining)
        if not self.ids:
            self._set([seq_id for seq_id, _ in joining], new_layers, new_mask, new_lengths, lengths)
            return
        grow = width - self._mask.shape[1]  # a joining sequence longer than the batch: pad it on the left
        layers = [
            (_append_rows(layer.keys, new_keys, grow), _append_rows(layer.values, new_values, grow))
            for layer, (new_keys, new_values) in zip(self._cache.layers, new_layers, strict=True)
        ]
        self._set(
            [*self.ids, *(seq_id for seq_id, _ in joining)],
            layers,
            _append_rows(self._mask, new_mask, grow),
            torch.cat([self._lengths, new_lengths]),
            [*self._host_lengths, *lengths],
        )

    def _set(
        self, ids: list[int], layers: list[Any], mask: Any, lengths: Any, host_lengths: list[int]
    ) -> None:
        from transformers import DynamicCache

        self.ids, self._mask, self._lengths, self._host_lengths = ids, mask, lengths, host_lengths
        self._cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def step(self, last_tokens: list[int]) -> Any:
        """One decode step of every member: the last position's logits, one row per member."""
        import torch

        ones = self._mask.new_ones((len(self.ids), 1))
        self._mask = torch.cat([self._mask, ones], dim=1)
        logits = forward_with_cache(
            self.model,
            self._cache,
            input_ids=torch.tensor([[token] for token in last_tokens]).to(self._mask.device),
            attention_mask=self._mask,
            position_ids=self._lengths,
            **logits_at(self.model, 1),
        ).logits[:, -1]
        self._lengths = self._lengths + 1
        self._host_lengths = [length + 1 for length in self._host_lengths]
        return logits

    def cache_of(self, seq_id: int) -> Any:
        """A member's own cache (views into the batch, without the padding)."""
        row = self.ids.index(seq_id)
        return row_cache(self.model, self._cache, row, self._mask.shape[1] - self._host_lengths[row])

    def clear(self) -> None:
        """No members (the stacked cache is freed)."""
        self.ids, self._cache, self._mask, self._lengths, self._host_lengths = [], None, None, None, []


def row_cache(model: Any, batch: Any, row: int, start: int, end: int | None = None) -> Any:
    """Row ``row``'s own KV as a ``DynamicCache``: positions ``start:end`` of the stacked cache
    ``batch`` (views, not copies).

    Example::

        own = row_cache(model, batch_cache, 2, start=7)   # row 2 without its 7 padded positions
    """
    from transformers import DynamicCache

    layers = [
        (layer.keys[row : row + 1, :, start:end], layer.values[row : row + 1, :, start:end])
        for layer in batch.layers
    ]
    return DynamicCache(ddp_cache_data=layers, config=model.config)


def _append_rows(old: Any, new: Any, grow: int) -> Any:
    """``new``'s rows after ``old``'s (whose positions are first shifted right by ``grow``), in one
    copy of each."""
    import torch

    if not grow:
        return torch.cat([old, new])
    out = old.new_zeros((old.shape[0] + new.shape[0], *new.shape[1:]))
    if old.dim() == 2:  # a mask: (rows, positions)
        out[: old.shape[0], grow:] = old
    else:  # keys or values: (rows, heads, positions, dim)
        out[: old.shape[0], :, grow:] = old
    out[old.shape[0] :] = new
    return out


def stack_left_padded(tensors: list[Any], lengths: list[int], longest: int) -> Any:
    """One (batch, heads, ``longest``, dim) tensor from single-sequence ``tensors`` of the given
    ``lengths``, each right-aligned (zeros before its first position), in one copy.

    Example::

        keys = stack_left_padded([cache_a.layers[0].keys, cache_b.layers[0].keys], [5, 3], 5)
    """
    first = tensors[0]
    out = first.new_zeros((len(tensors), first.shape[1], longest, first.shape[3]))
    for row, (tensor, length) in enumerate(zip(tensors, lengths, strict=True)):
        out[row, :, longest - length :] = tensor[0]
    return out
