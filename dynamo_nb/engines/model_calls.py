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

import functools
import inspect
from typing import Any

__all__ = ["cache_argument", "forward_with_cache", "new_kv_cache"]


@functools.cache
def _cache_argument_of(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(model: Any) -> str:
    """The name under which ``model``'s forward takes its KV cache: ``cache`` or ``past_key_values``."""
    return _cache_argument_of(type(model))


def new_kv_cache(model: Any) -> Any:
    """An empty ``DynamicCache`` for ``model`` (its layers fill as `forward_with_cache` runs)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def forward_with_cache(model: Any, cache: Any, **inputs: Any) -> Any:
    """``model(**inputs)`` reading and extending ``cache`` (a ``DynamicCache``) in place; its output."""
    return model(**inputs, **{cache_argument(model): cache}, use_cache=True)
