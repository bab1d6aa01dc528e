"""Dynamo's ``dynamo.llm`` registration names on dynamo_nb: ``register_llm`` (and its newer
name ``register_model``), ``unregister_llm`` / ``unregister_model``, ``ModelInput``,
``ModelType``, ``WorkerType``, ``ModelRuntimeConfig``.

``LLMUnaryClient``, ``UnaryChatModel`` and ``with_engine_data`` (Dynamo's unary helpers) are
here too (`dynamo_nb.compat.llm_unary`); the registration names are in
`dynamo_nb.compat.llm_register`. This module is their table of contents.

A Dynamo LLM worker registers its model before it serves::

    from dynamo_nb.compat.llm import ModelInput, ModelType, register_llm

    await register_llm(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, model_path, "tiny")
    await endpoint.serve_endpoint(generate)   # token ids in, {"token_ids": [...]} items out

The card is built (and the model folder checked) at once and published when the endpoint
serves, with the instance's lease; frontends then serve the model. Differences from Dynamo:
``ModelInput.Text`` (the frontend sends raw text) is refused with a clear error, as dynamo_nb's
frontend always tokenizes; ``router_mode``, ``migration_limit``, ``user_data`` and LoRA
arguments are accepted and ignored (``unregister_model(lora_name=...)`` is refused);
`LLMUnaryClient` takes an item without ``index`` as choice 0 (dynamo_nb's engines do not send
it); `UnaryChatModel` ignores ``chat_template`` (the model folder's template is used).

Not provided (Dynamo 1.6.1 names this module lacks), each with its reason:

- ``HttpService``, ``HttpAsyncEngine``, ``HttpError``, ``KserveGrpcService``,
  ``PythonAsyncEngine``, ``EntrypointArgs``, ``EngineType``, ``make_engine``, ``run_input``,
  ``FrontendExtensionContext``, ``FrontendResponse``, ``FrontendRoute``, ``RoutedEngine``,
  ``exceptions``: the HTTP frontend is dynamo_nb's own (`dynamo_nb.frontend.Frontend`, or
  ``components/frontend.py``), with its own error envelope;
- ``KvRouter``, ``KvRouterConfig``, ``RouterConfig``, ``RouterMode``,
  ``RouterQueueLimitExceeded``, ``RoutingConstraints``, ``OverlapScores``, ``RadixTree``,
  ``KvEventPublisher``, ``compute_block_hash_for_seq``, ``run_kv_indexer``,
  ``LoadThresholdConfig``, ``WorkerMetricsPublisher``, ``SelectionService``,
  ``run_select_service``, ``run_slot_tracker``: routing and KV events are dynamo_nb's own
  (`dynamo_nb.router`), set on the frontend;
- ``KvDcRelay``, ``KvStateAgentHost``, ``KvStateAttachmentOwner``, ``FpmDirectPublisher``,
  ``FpmEventRelay``, ``FpmEventSubscriber``, ``AisPerfConfig``: cross-datacenter KV relays,
  KV state agents and forward-pass metrics have no counterpart here;
- ``fetch_llm``, ``fetch_model``, ``LoRADownloader``, ``lora_name_to_id``,
  ``update_model_taints``, ``ModelCardInstanceId``: model hubs are not reached (a local folder
  or the built-in tiny model is served), and there are no LoRA adapters or model taints;
- ``MediaDecoder``, ``MediaFetcher``, ``MultimodalEmbeddingCachePublisher``: models are text only.

Added here: none.
"""

from __future__ import annotations

from ..llm.card import ModelRuntimeConfig
from .llm_register import (
    ModelInput,
    ModelType,
    WorkerType,
    register_llm,
    register_model,
    unregister_llm,
    unregister_model,
)
from .llm_unary import LLMUnaryClient, UnaryChatModel, with_engine_data

__all__ = [
    "LLMUnaryClient",
    "ModelInput",
    "ModelRuntimeConfig",
    "ModelType",
    "UnaryChatModel",
    "WorkerType",
    "register_llm",
    "register_model",
    "unregister_llm",
    "unregister_model",
    "with_engine_data",
]
