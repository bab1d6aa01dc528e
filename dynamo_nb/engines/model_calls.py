"""A transformers forward pass with a KV cache, the same on every transformers release we support.

transformers 5.2x renamed the forward's ``past_key_values`` argument (and the output's field) to
``cache`` and warns on the old name; 5.19 (the release vLLM's CPU build pins) knows only the old
one. `forward_with_cache` passes the cache under the name the model's ``forward`` declares, so an
engine written in a notebook runs without a deprecation warning on either.

Example::

    cache = new_kv_cache(model)
    logits = forward_with_cache(model, cache, input_ids=ids).logits[0, -1]  # cache now holds ids
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

__all__ = [
    "attention_kernels",
    "cache_argument",
    "forward_with_cache",
    "kv_cache_holding",
    "logits_at",
    "new_kv_cache",
]


@functools.cache
def _cache_argument_of(model_class: Any) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@functools.cache
def _keeps_logits(model_class: Any) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def logits_at(model: Any, keep: Any) -> dict[str, Any]:
    """The forward's arguments that compute logits only where needed: ``keep`` is a count of
    last positions or a tensor of positions (``logits_to_keep``); none for a model without it,
    which computes them everywhere.

    Example::

        out = forward_with_cache(model, cache, input_ids=ids, **logits_at(model, 1))  # last only
    """
    return {"logits_to_keep": keep} if _keeps_logits(model.__class__) else {}


@contextlib.contextmanager
def attention_kernels(device: str) -> Iterator[None]:
    """On CUDA, scaled-dot-product attention without cuDNN's kernel while the block runs.

    The engines' batched steps pass an attention mask (padding), for which PyTorch prefers
    cuDNN's attention on recent GPUs; cuDNN builds an execution plan for every new key length,
    and a decode step's key length is new at every step (measured on an H100: 57 ms a step at
    32 sequences instead of about 20). Flash, memory-efficient and math kernels need no plan.
    The choice is PyTorch's process-wide setting, restored on exit. Elsewhere: nothing changes.

    Example::

        with torch.inference_mode(), attention_kernels(engine.device):
            logits = forward_with_cache(model, cache, input_ids=ids, attention_mask=mask).logits
    """
    if not device.startswith("cuda"):
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def cache_argument(model: Any) -> str:
    """The name under which ``model``'s forward takes its KV cache: ``cache`` or ``past_key_values``."""
    return _cache_argument_of(model.__class__)


def new_kv_cache(model: Any) -> Any:
    """An empty ``DynamicCache`` for ``model`` (its layers fill as `forward_with_cache` runs)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def kv_cache_holding(model: Any, layers: list[tuple[Any, Any]]) -> Any:
    """A ``DynamicCache`` for ``model`` holding each layer's ``(keys, values)`` tensors as they are:
    views stay views, nothing is copied (``DynamicCache(ddp_cache_data=…)`` copies every tensor
    once). Only plain full-attention layers (see `dynamo_nb.engines.hf_batch.can_batch`).

    Example::

        cache = kv_cache_holding(model, [(layer.keys[:, :, 7:], layer.values[:, :, 7:]) for layer in old.layers])
    """
    cache = new_kv_cache(model)
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return cache


def forward_with_cache(model: Any, cache: Any, **inputs: Any) -> Any:
    """``model(**inputs)`` reading and extending ``cache`` (a ``DynamicCache``) in place; its output."""
    return model(**inputs, **{cache_argument(model): cache}, use_cache=True)
