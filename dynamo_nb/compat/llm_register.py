"""Dynamo's model registration on dynamo_nb: `register_llm` / `register_model`,
`unregister_llm` / `unregister_model`, `ModelInput`, `ModelType`, `WorkerType` (re-exported by
`dynamo_nb.compat.llm`, where the differences from Dynamo are listed).

Example::

    await register_model(ModelInput.Tokens, ModelType.Chat, endpoint, model_path, model_name="tiny")
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..llm.card import ModelCard, ModelRuntimeConfig
from ..llm.register import llm_card, publish_card, unpublish_cards
from .runtime import Endpoint

__all__ = [
    "ModelInput",
    "ModelRuntimeConfig",
    "ModelType",
    "WorkerType",
    "register_llm",
    "register_model",
    "unregister_llm",
    "unregister_model",
]


class ModelInput(enum.Enum):
    """What the worker takes: token ids (``Tokens``) or text (``Text``, not supported here)."""

    Tokens = "tokens"
    Text = "text"


class ModelType(enum.Flag):
    """What the model serves; combine with ``|``."""

    Chat = enum.auto()
    Completions = enum.auto()
    Prefill = enum.auto()
    Embedding = enum.auto()


class WorkerType(enum.Enum):
    """What a worker does in a disaggregated deployment (`register_model`'s ``worker_type``)."""

    Aggregated = "aggregated"
    Prefill = "prefill"
    Decode = "decode"


_KINDS = {ModelType.Chat: "chat", ModelType.Completions: "completions", ModelType.Prefill: "prefill"}


async def register_llm(
    model_input: ModelInput,
    model_type: ModelType,
    endpoint: Endpoint,
    model_path: str | Path,
    model_name: str | None = None,
    context_length: int | None = None,
    kv_cache_block_size: int | None = None,
    runtime_config: ModelRuntimeConfig | dict[str, Any] | None = None,
    **_ignored: Any,
) -> ModelCard:
    """Build ``endpoint``'s model card now; it is published when the endpoint serves.

    Example::

        card = await register_llm(ModelInput.Tokens, ModelType.Chat, endpoint, tiny_model_path(), "tiny")
    """
    if model_input is not ModelInput.Tokens:
        raise ConfigError(
            f"register_llm: {model_input} is not supported; dynamo_nb's frontend tokenizes, so use ModelInput.Tokens"
        )
    if ModelType.Embedding in model_type:
        raise ConfigError(
            "register_llm: ModelType.Embedding is not supported; use Chat, Completions or Prefill"
        )
    kinds = [kind for flag, kind in _KINDS.items() if flag in model_type]
    inner = await endpoint._inner()
    options: dict[str, Any] = {"model_name": model_name, "kind": kinds, "context_length": context_length}
    if kv_cache_block_size:
        options["kv_cache_block_size"] = kv_cache_block_size
    if runtime_config is not None:
        options["runtime_config"] = runtime_config
    card = llm_card(inner, model_path, **options)
    runtime = endpoint.component.namespace.runtime
    serving = runtime.serving.get(endpoint.path)
    if serving is not None:  # registered after (or while) the endpoint started serving
        await publish_card(serving, card)
    else:
        runtime.pending_cards.setdefault(endpoint.path, []).append(card)
    return card


async def register_model(
    model_input: ModelInput,
    model_type: ModelType,
    endpoint: Endpoint,
    model_path: str | Path,
    model_name: str | None = None,
    *,
    worker_type: WorkerType | None = None,
    **options: Any,
) -> ModelCard:
    """Dynamo's newer name for `register_llm` (keyword arguments, and a ``worker_type``:
    `WorkerType.Prefill` registers a prefill worker).

    Example::

        await register_model(model_input=ModelInput.Tokens, model_type=ModelType.Chat,
                             endpoint=endpoint, model_path=tiny_model_path(), model_name="tiny")
    """
    if worker_type is WorkerType.Prefill:
        model_type = ModelType.Prefill
    return await register_llm(model_input, model_type, endpoint, model_path, model_name, **options)


async def unregister_model(endpoint: Endpoint, lora_name: str | None = None) -> None:
    """Take ``endpoint``'s model out of discovery while it goes on serving (Dynamo's
    ``unregister_llm``, e.g. before an engine sleeps); `register_model` publishes it again.

    Example::

        await unregister_model(endpoint)
    """
    if lora_name is not None:
        raise ConfigError("unregister_model: LoRA adapters are not supported here; call it without lora_name")
    runtime = endpoint.component.namespace.runtime
    runtime.pending_cards.pop(endpoint.path, None)
    serving = runtime.serving.get(endpoint.path)
    if serving is not None:
        await unpublish_cards(serving)


unregister_llm = unregister_model
