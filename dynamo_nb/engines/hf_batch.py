"""One batched decode step over sequences whose KV caches have different lengths (the hf engine's
continuous batching: sequences join and leave between steps).

Each sequence keeps its own ``DynamicCache``. For a step the caches are left-padded to the
longest, stacked into one batch, and the model runs once with an attention mask that hides the
padding and each sequence's own positions; each sequence then gets its grown cache back without
the padding. A sequence's logits do not depend on what it was batched with: padded keys are
masked out exactly (their weight is zero) and every row keeps its own positions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["can_batch", "decode_step"]


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


def decode_step(model: Any, caches: list[Any], last_tokens: list[int], torch: Any) -> tuple[Any, list[Any]]:
    """Run one decode step of every sequence at once: ``(logits, caches)``, the last position's
    logits (one row per sequence) and each sequence's cache grown by its token.

    Example::

        logits, caches = decode_step(model, [a.cache, b.cache], [a.last_token, b.last_token], torch)
    """
    from transformers import DynamicCache

    device = caches[0].layers[0].keys.device
    lengths = [cache.get_seq_length() for cache in caches]
    longest = max(lengths)
    stacked = [
        (
            _stack_left_padded([cache.layers[index].keys for cache in caches], lengths, longest),
            _stack_left_padded([cache.layers[index].values for cache in caches], lengths, longest),
        )
        for index in range(len(caches[0].layers))
    ]
    batch = DynamicCache(ddp_cache_data=stacked, config=model.config)
    mask = torch.zeros((len(caches), longest + 1), dtype=torch.long, device=device)
    for row, length in enumerate(lengths):
        mask[row, longest - length :] = 1
    input_ids = torch.tensor([[token] for token in last_tokens], device=device)
    position_ids = torch.tensor([[length] for length in lengths], device=device)
    logits = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        past_key_values=batch,
        use_cache=True,
    ).logits[:, -1]
    grown = []
    for row, length in enumerate(lengths):
        start = longest - length  # views into the batch: the next step copies them into its own
        layers = [
            (layer.keys[row : row + 1, :, start:], layer.values[row : row + 1, :, start:])
            for layer in batch.layers
        ]
        grown.append(DynamicCache(ddp_cache_data=layers, config=model.config))
    return logits, grown


def _stack_left_padded(tensors: list[Any], lengths: list[int], longest: int) -> Any:
    """One (batch, heads, ``longest``, dim) tensor from single-sequence ``tensors``, each
    right-aligned (zeros before its first position), in one copy."""
    first = tensors[0]
    out = first.new_zeros((len(tensors), first.shape[1], longest, first.shape[3]))
    for row, (tensor, length) in enumerate(zip(tensors, lengths, strict=True)):
        out[row, :, longest - length :] = tensor[0]
    return out
