"""The hf engine's prefill: which prompt chunks a step runs, and running them in one forward pass.

`plan_prefill` splits a step's token budget among the prompts waiting for their KV, in
arrival order, as vLLM's scheduler does with ``--max-num-batched-tokens`` and
``--enable-chunked-prefill``: the running decodes' tokens count first, then each waiting
prompt takes what it still needs; with chunking, a prompt longer than what is left takes the
rest now and goes on next step, so decodes keep getting a token every step. One rule of our
own: the first waiting prompt always makes progress, a whole budget's chunk (or the whole prompt
without chunking) even when the decodes used the budget up, so a prompt never waits for the
decodes to finish.

`prefill_rows` runs the planned chunks in as few forward passes as pay (`prefill_passes`): in a
shared pass each row's past KV (a prefix-cache hit, or its earlier chunks) is left-padded to the
longest past, its new tokens right-padded to the longest chunk, an attention mask hiding both
paddings and every row's own positions. A row's logits and KV equal those of running it alone:
padded keys get zero weight, and a padded query (after a row's real tokens) still sees that
row's real keys, so nothing turns into NaN. On a GPU every chunk shares one pass (its cores
are idle otherwise); on a CPU, which computes every padded position, only short chunks without
a past do (measured on the tiny model, one thread: a 561-token prompt beside a 100-token one
took 63 ms in one pass, 31 ms one after the other; beside a chunk with a 333-token past, 128
ms against 65; four 64-token prompts 0.8 × the time alone).

Example::

    plan_prefill([300, 40], 256, decodes=3)                      # [253]: 40 wait for the next step
    logits, caches = prefill_rows(model, [PrefillRow(empty_cache, [5, 6, 7]), PrefillRow(hit, [9])])
    logits.shape                                                  # (2, vocab): each row's last token
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .hf_batch import can_batch, row_cache, stack_left_padded
from .model_calls import forward_with_cache, logits_at, new_kv_cache

__all__ = ["PrefillRow", "plan_prefill", "prefill_passes", "prefill_rows"]

CPU_PASS_TOKENS = 256
"""On a CPU, chunks without a past share a pass while the pass computes at most this many token
positions (rows × the longest chunk): beyond it a pass costs more than its rows alone."""


def plan_prefill(needs: Sequence[int], budget: int, *, decodes: int = 0, chunked: bool = True) -> list[int]:
    """Prompt tokens each waiting prompt prefills this step, in order (the rest wait).

    ``needs``: tokens each still has to prefill; ``budget``: the step's token budget
    (``--max-num-batched-tokens``), of which ``decodes`` go to the running decodes first. See the
    module docstring for the rule.

    Example:
        >>> plan_prefill([100, 100, 100], 256, decodes=6)
        [100, 100, 50]
        >>> plan_prefill([100, 100, 100], 256, decodes=6, chunked=False)
        [100, 100]
        >>> plan_prefill([100], 64, decodes=80), plan_prefill([100], 1, chunked=False)
        ([64], [100])
    """
    left = budget - decodes
    sizes: list[int] = []
    for need in needs:
        if need <= left:
            take = need
        elif chunked and left > 0:
            take = left
        else:
            break
        sizes.append(take)
        left -= take
        if left <= 0:
            break
    if not sizes and needs:  # the first prompt always makes progress
        sizes.append(min(needs[0], budget) if chunked else needs[0])
    return sizes


@dataclass
class PrefillRow:
    """One prompt chunk of a step: ``past`` holds the prompt's KV so far (a ``DynamicCache``,
    empty for a first chunk without a prefix-cache hit), ``tokens`` are the chunk's ids."""

    past: Any
    tokens: list[int]


def prefill_passes(rows: Sequence[PrefillRow], device_type: str) -> list[list[int]]:
    """Which of ``rows`` run together, as lists of their indexes, in order: on ``"cuda"`` all in
    one pass (when their caches can be stacked); on a CPU, consecutive chunks without a past
    while the pass stays within `CPU_PASS_TOKENS` positions, every other chunk alone (see the
    module docstring).

    Example:
        >>> short, long = [PrefillRow(None, [1] * 8)] * 3, PrefillRow(None, [1] * 300)
        >>> prefill_passes([*short, long], "cpu"), prefill_passes([*short, long], "cuda")
        ([[0, 1, 2], [3]], [[0, 1, 2, 3]])
    """
    if device_type != "cpu":
        return [list(range(len(rows)))] if rows else []
    passes: list[list[int]] = []
    longest, joinable = 0, False  # the last pass's longest chunk; whether fresh chunks may join it
    for index, row in enumerate(rows):
        fresh = row.past is None or row.past.get_seq_length() == 0
        widest = max(longest, len(row.tokens))
        if fresh and joinable and widest * (len(passes[-1]) + 1) <= CPU_PASS_TOKENS:
            passes[-1].append(index)
            longest = widest
        else:
            passes.append([index])
            longest, joinable = len(row.tokens), fresh
    return passes


def prefill_rows(model: Any, rows: list[PrefillRow]) -> tuple[Any, list[Any]]:
    """Run ``rows`` in the forward passes `prefill_passes` groups them in: each row's last
    logits (rows, vocab) and its KV cache (a ``DynamicCache`` of its past and its chunk, views
    into its pass's; a lone row's ``past``, extended in place)."""
    import torch

    passes = prefill_passes(rows, model.device.type)
    if len(passes) == 1:
        return _one_pass(model, rows)
    logits: list[Any] = [None] * len(rows)
    caches: list[Any] = [None] * len(rows)
    for indexes in passes:
        pass_logits, pass_caches = _one_pass(model, [rows[index] for index in indexes])
        for position, index in enumerate(indexes):
            logits[index], caches[index] = pass_logits[position], pass_caches[position]
    return torch.stack(logits), caches


def _one_pass(model: Any, rows: list[PrefillRow]) -> tuple[Any, list[Any]]:
    """``rows`` in one forward pass (see the module docstring); one at a time where their caches
    cannot be stacked."""
    import torch

    device = model.device
    if len(rows) == 1 or not can_batch([row.past for row in rows]):
        logits, caches = [], []
        for row in rows:  # one at a time: a lone chunk, or caches that cannot be stacked
            input_ids = torch.tensor([row.tokens]).to(device)
            out = forward_with_cache(model, row.past, input_ids=input_ids, **logits_at(model, 1))
            logits.append(out.logits[0, -1])
            caches.append(row.past)
        return torch.stack(logits), caches
    pasts = [row.past.get_seq_length() for row in rows]
    chunks = [len(row.tokens) for row in rows]
    longest_past, longest_chunk = max(pasts), max(chunks)
    batch = new_kv_cache(model) if longest_past == 0 else _stacked_past(model, rows, pasts, longest_past)
    input_ids = torch.tensor([row.tokens + [0] * (longest_chunk - len(row.tokens)) for row in rows])
    mask = torch.tensor(
        [
            [0] * (longest_past - past) + [1] * (past + chunk) + [0] * (longest_chunk - chunk)
            for past, chunk in zip(pasts, chunks, strict=True)
        ]
    )
    positions = torch.tensor(pasts).unsqueeze(1) + torch.arange(longest_chunk)
    input_ids, mask, positions = (
        tensor.to(device) for tensor in (input_ids, mask, positions)
    )  # one copy each
    kept = sorted({chunk - 1 for chunk in chunks})  # the positions whose logits are needed
    out = forward_with_cache(
        model, batch, input_ids=input_ids, attention_mask=mask, position_ids=positions,
        **logits_at(model, torch.tensor(kept, device=device)),
    )  # fmt: skip
    if out.logits.shape[1] == len(kept):
        last = torch.tensor([kept.index(chunk - 1) for chunk in chunks], device=device)
    else:  # a model that computes every position's logits
        last = torch.tensor([chunk - 1 for chunk in chunks], device=device)
    logits = out.logits[torch.arange(len(rows), device=device), last]
    caches = [  # views, not copies: a row's next step copies them anyway (decode batch or next chunk)
        row_cache(model, batch, index, longest_past - past, longest_past + chunk)
        for index, (past, chunk) in enumerate(zip(pasts, chunks, strict=True))
    ]
    return logits, caches


def _stacked_past(model: Any, rows: list[PrefillRow], pasts: list[int], longest: int) -> Any:
    """The rows' pasts as one cache, each left-padded to ``longest`` (an empty past: all padding)."""
    from transformers import DynamicCache

    template = next(row.past for row, past in zip(rows, pasts, strict=True) if past)
    layers = []
    for index, layer in enumerate(template.layers):
        keys, values = [], []
        for row, past in zip(rows, pasts, strict=True):
            own = row.past.layers[index]
            keys.append(own.keys if past else layer.keys[:, :, :0])  # an empty past: all padding
            values.append(own.values if past else layer.values[:, :, :0])
        layers.append((stack_left_padded(keys, pasts, longest), stack_left_padded(values, pasts, longest)))
    return DynamicCache(ddp_cache_data=layers, config=model.config)
