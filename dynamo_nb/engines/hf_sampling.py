"""The hf engine's sampling: the next token of every row of a step, left on the device.

`sample_rows` picks one token per row of a logits matrix, greedy rows and sampled rows alike
(each sampled row with its own options and ``torch.Generator``), and returns them as one
tensor on the logits' device: the engine moves a step's tokens to the host in one transfer
(``tokens.tolist()``) instead of one sync per sequence. A row's token is what it would be
alone: greedy rows take their argmax, sampled rows draw from their own generator.

Example::

    tokens = sample_rows(logits, [SamplingOptions(temperature=0), SamplingOptions(seed=1)], [g0, g1])
    tokens.tolist()  # [311, 87]: the step's only device-to-host copy
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..llm.protocol import SamplingOptions

__all__ = ["sample_rows"]


def sample_rows(logits: Any, options: Sequence[SamplingOptions], generators: Sequence[Any]) -> Any:
    """One token per row of ``logits`` (rows, vocab), as a (rows,) tensor on its device."""
    import torch

    logits = logits.float()
    tokens = torch.argmax(logits, dim=-1)
    for row, (option, generator) in enumerate(zip(options, generators, strict=True)):
        if not option.greedy:
            tokens[row] = _draw(logits[row], option, generator, torch)
    return tokens


def _draw(logits: Any, options: SamplingOptions, generator: Any, torch: Any) -> Any:
    """A token drawn from one row's ``logits`` with temperature, top-k and top-p (a 0-d tensor)."""
    logits = logits / (1.0 if options.temperature is None else options.temperature)
    if options.top_k is not None and options.top_k < logits.shape[-1]:
        kth = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if options.top_p is not None and options.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > options.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator)[0]
