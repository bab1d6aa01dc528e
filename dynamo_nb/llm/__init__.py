"""The LLM layer: what a frontend sends a worker and gets back, model cards, tokenizers, serving.

- ``protocol.py``: `PreprocessedRequest` (tokens, stop conditions, sampling, routing,
  bootstrap info) and `LLMEngineOutput` (new tokens, finish reason, usage, disaggregated params);
- ``bootstrap_info.py``: `BootstrapInfo` and `PrefillResult`, what joins a prefill to its
  decode, typed and checked where a request enters a process;
- ``card.py``: `ModelCard` and its runtime config, read from a model folder;
- ``register.py``: `serve_llm` / `register_llm` (publish the card), `engine_handler`;
- ``guided.py``: `GuidedDecoding`, structured output (``response_format``,
  ``nvext.structured_outputs``) and the llguidance grammar that enforces it;
- ``tool_calls.py``: tool calls read out of a model's text (``--tool-call-parser``) and the
  grammar that forces one (``tool_choice`` required or named);
- ``limits.py``: `RequestLimits`, the vocabulary and context a worker checks each request against;
- ``tokenizer.py`` and ``detokenize.py``: the frontend's chat template, tokenizer and
  incremental detokenizer with stop strings; ``segment_cache.py``: a prompt's pieces between
  added tokens tokenized once each (a conversation's history is not tokenized again each turn).

Example:
    >>> from dynamo_nb.llm import PreprocessedRequest
    >>> PreprocessedRequest.from_dict({"token_ids": [1, 2]}).token_ids
    [1, 2]
"""

from __future__ import annotations

from .bootstrap_info import BootstrapInfo, PrefillResult
from .card import CARD_PREFIX, MODEL_KINDS, ModelCard, ModelRuntimeConfig, card_from_folder, check_model_dir
from .detokenize import StreamDetokenizer
from .limits import RequestLimits
from .protocol import EmittingStream, LLMEngineOutput, PreprocessedRequest, SamplingOptions, StopConditions
from .register import (
    EngineMethod,
    ReadinessGate,
    engine_handler,
    model_from_args,
    publish_card,
    register_llm,
    serve_llm,
)
from .tokenizer import ModelTokenizer

__all__ = [
    "CARD_PREFIX",
    "MODEL_KINDS",
    "BootstrapInfo",
    "EmittingStream",
    "EngineMethod",
    "LLMEngineOutput",
    "ModelCard",
    "ModelRuntimeConfig",
    "ModelTokenizer",
    "PrefillResult",
    "PreprocessedRequest",
    "ReadinessGate",
    "RequestLimits",
    "SamplingOptions",
    "StopConditions",
    "StreamDetokenizer",
    "card_from_folder",
    "check_model_dir",
    "engine_handler",
    "model_from_args",
    "publish_card",
    "register_llm",
    "serve_llm",
]
