"""The hf engine's decoding sequences as one batch that lives across steps (continuous batching:
sequences join and leave between steps).

A `DecodeBatch` holds the KV caches of its members stacked in preallocated buffers, each row
left-padded to the longest, with an attention mask that hides the padding and each row's own
positions. A step runs the model once for every member and writes its new column in place;
when the members change, only the joining ones are copied in (and a leaving row is filled by
the last one). A member's logits do not depend on what it was batched with: padded keys are
masked out exactly (their weight is zero) and every row keeps its own positions.
"""

from __future__ import annotations

from typing import Any

from .model_calls import forward_with_cache, kv_cache_holding, logits_at, new_kv_cache

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


class _Window:
    """Where a `DecodeBatch`'s members lie in its buffers: rows ``[0, rows)``, columns
    ``[start, end)`` (each row right-aligned at ``end``)."""

    __slots__ = ("end", "rows", "start")

    def __init__(self) -> None:
        self.rows = self.start = self.end = 0


def _slot_layer_class() -> type:
    """The cache layer a `DecodeBatch` runs its steps with (built on first use: transformers is
    imported only when a model is)."""
    global _SLOT_LAYER
    if _SLOT_LAYER is None:
        from transformers.cache_utils import DynamicLayer

        class SlotLayer(DynamicLayer):
            """One layer's KV in preallocated buffers (rows × heads × columns × dim): a step writes
            its new column in place instead of concatenating (which copies the whole cache)."""

            def __init__(self, window: _Window, keys: Any, values: Any) -> None:
                super().__init__()
                self.window, self.key_buffer, self.value_buffer = window, keys, values
                self.is_initialized, self.device = True, keys.device
                self.dtype = keys.dtype
                self.expose()

            def expose(self, extra: int = 0) -> None:
                w = self.window
                self.keys = self.key_buffer[: w.rows, :, w.start : w.end + extra]
                self.values = self.value_buffer[: w.rows, :, w.start : w.end + extra]

            def update(
                self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
            ) -> tuple[Any, Any]:
                w, new = self.window, key_states.shape[-2]
                self.key_buffer[: w.rows, :, w.end : w.end + new] = key_states
                self.value_buffer[: w.rows, :, w.end : w.end + new] = value_states
                self.expose(new)
                return self.keys, self.values

            def get_seq_length(self) -> int:
                return self.window.end - self.window.start

        _SLOT_LAYER = SlotLayer
    return _SLOT_LAYER


_SLOT_LAYER: type | None = None


class DecodeBatch:
    """Decoding sequences whose caches stay stacked between steps, in preallocated buffers.

    Each layer's keys and values live in buffers with room for more rows and more columns: the
    members are rows ``0…n-1``, right-aligned at the same column. A step writes its new column in
    place (no copy of the cache), a member that leaves is replaced by the last row (one row
    copied), and one that joins is copied into the next free row (its own KV only). The buffers
    are reallocated (one copy of the members) only when they run out of rows or columns, each
    time with twice the room, so the copies are few however many sequences come and go. Row
    lengths are kept on the host too, so nothing here waits for the device.

    Example::

        batch = DecodeBatch(model)
        batch.update(set(), [(7, cache_7), (9, cache_9)])  # sequence ids joining, with their own caches
        logits = batch.step([last_token_7, last_token_9])  # one row each, in `ids` order
        batch.update({9}, [])                              # 7 left
        cache_9 = batch.cache_of(9)  # its cache again (a copy), e.g. to run alone
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.ids: list[int] = []  # the members, in row order
        self.joined_rows = 0  # rows copied in by joins (a measure of what membership changes cost)
        self.reallocations = 0  # times the buffers were replaced (the only copies of every member)
        self._window = _Window()
        self._cache: Any = None  # a DynamicCache of slot layers (None: no buffers yet)
        self._mask: Any = None  # (rows, columns) buffer: 1 where a row has a real position
        self._positions: Any = None  # (rows, 1) buffer: each row's own length, its next position
        self._host_lengths: list[int] = []

    def update(self, keep: set[int], joining: list[tuple[int, Any]]) -> None:
        """The members in ``keep`` stay, the others leave (the last row takes a leaving row's
        place), and ``joining`` (sequence ids with their own caches, see `can_batch`) join after them."""
        for seq_id in [seq_id for seq_id in self.ids if seq_id not in keep]:
            self._leave(self.ids.index(seq_id))
        if not self.ids:
            self.clear()
        if joining:
            lengths = [cache.get_seq_length() for _, cache in joining]
            self._make_room(len(self.ids) + len(joining), max(lengths), joining[0][1])
            for (seq_id, cache), length in zip(joining, lengths, strict=True):
                self._join(seq_id, cache, length)
        self._drop_unused_columns()

    def _leave(self, row: int) -> None:
        w, last = self._window, len(self.ids) - 1
        if row != last:  # the last row moves into the hole
            for layer in self._cache.layers:
                layer.key_buffer[row, :, w.start : w.end] = layer.key_buffer[last, :, w.start : w.end]
                layer.value_buffer[row, :, w.start : w.end] = layer.value_buffer[last, :, w.start : w.end]
            self._mask[row, w.start : w.end] = self._mask[last, w.start : w.end]
            self._positions[row] = self._positions[last]
            self.ids[row], self._host_lengths[row] = self.ids[last], self._host_lengths[last]
        self.ids.pop()
        self._host_lengths.pop()
        w.rows = len(self.ids)

    def _join(self, seq_id: int, cache: Any, length: int) -> None:
        w, row = self._window, len(self.ids)
        pad = w.end - length
        for layer, own in zip(self._cache.layers, cache.layers, strict=True):
            for buffer, tensor in ((layer.key_buffer, own.keys), (layer.value_buffer, own.values)):
                buffer[row, :, w.start : pad] = 0
                buffer[row, :, pad : w.end] = tensor[0]
        self._mask[row, w.start : pad] = 0
        self._mask[row, pad : w.end] = 1
        self._positions[row, 0] = length
        self.ids.append(seq_id)
        self._host_lengths.append(length)
        w.rows = len(self.ids)
        self.joined_rows += 1

    def _make_room(self, rows: int, longest: int, like: Any) -> None:
        """Buffers with at least ``rows`` rows and a window at least ``longest`` columns long
        (reallocated, with twice the room, only when they lack either); ``like``: a cache whose
        layers' heads, dims, dtype and device the first buffers take."""
        w = self._window
        capacity = self._mask.shape[0] if self._cache is not None else 0
        if rows <= capacity and w.end >= longest:
            if w.end - longest < w.start:  # the window widens to the left: no member has a position there
                self._mask[: len(self.ids), w.end - longest : w.start] = 0
                w.start = w.end - longest
            return
        width = max(longest, w.end - w.start)
        self._reallocate(capacity if rows <= capacity else max(rows, 2 * capacity), width, 2 * width, like)

    def _reallocate(self, rows: int, width: int, columns: int, like: Any = None) -> None:
        """New buffers of ``rows`` × ``columns`` (each layer's as the current buffers', else as
        ``like``'s keys and values), the members' window (widened to ``width``, right-aligned)
        copied to their left end."""
        import torch

        w, members = self._window, len(self.ids)
        current = self._cache.layers if self._cache is not None else None
        examples = (
            [(layer.key_buffer, layer.value_buffer) for layer in current]
            if current is not None
            else [(layer.keys, layer.values) for layer in like.layers]
        )
        old = w.end - w.start
        device = examples[0][0].device
        mask = torch.zeros((rows, columns), dtype=torch.long, device=device)
        positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        layers = []
        for index, example in enumerate(examples):
            keys, values = (
                torch.zeros((rows, t.shape[1], columns, t.shape[3]), dtype=t.dtype, device=t.device)
                for t in example
            )
            if current is not None and members:
                keys[:members, :, width - old : width] = current[index].key_buffer[
                    :members, :, w.start : w.end
                ]
                values[:members, :, width - old : width] = current[index].value_buffer[
                    :members, :, w.start : w.end
                ]
            layers.append((keys, values))
        if members:
            mask[:members, width - old : width] = self._mask[:members, w.start : w.end]
            positions[:members] = self._positions[:members]
            self.reallocations += 1
        w.start, w.end = 0, width
        slot_layer = _slot_layer_class()
        cache = new_kv_cache(self.model)
        cache.layers = [slot_layer(w, keys, values) for keys, values in layers]
        self._cache, self._mask, self._positions = cache, mask, positions

    def _drop_unused_columns(self) -> None:
        """Columns before the longest member are no longer looked at (nothing is copied)."""
        if self.ids:
            self._window.start = self._window.end - max(self._host_lengths)

    def step(self, last_tokens: list[int]) -> Any:
        """One decode step of every member: the last position's logits, one row per member."""
        import torch

        w = self._window
        if w.end + 1 > self._mask.shape[1]:  # out of columns: the window moves left, into twice the room
            width = w.end - w.start
            self._reallocate(self._mask.shape[0], width, max(2 * width, width + 64))
        for layer in self._cache.layers:
            layer.expose()
        rows = len(self.ids)
        self._mask[:rows, w.end] = 1
        logits = forward_with_cache(
            self.model,
            self._cache,
            input_ids=torch.tensor([[token] for token in last_tokens]).to(self._mask.device),
            attention_mask=self._mask[:rows, w.start : w.end + 1],
            position_ids=self._positions[:rows],
            **logits_at(self.model, 1),
        ).logits[:, -1]
        w.end += 1
        self._positions[:rows] += 1
        self._host_lengths = [length + 1 for length in self._host_lengths]
        return logits

    def cache_of(self, seq_id: int) -> Any:
        """A member's own cache (a copy, without the padding)."""
        row, w = self.ids.index(seq_id), self._window
        start = w.end - self._host_lengths[row]
        layers = [
            (layer.key_buffer[row : row + 1, :, start : w.end].clone(),
             layer.value_buffer[row : row + 1, :, start : w.end].clone())
            for layer in self._cache.layers
        ]  # fmt: skip
        return kv_cache_holding(self.model, layers)

    def clear(self) -> None:
        """No members (the buffers are freed)."""
        self.ids, self._host_lengths = [], []
        self._cache = self._mask = self._positions = None
        self._window = _Window()


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
