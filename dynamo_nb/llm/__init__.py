"""The LLM protocol: requests and outputs between frontend and worker, model cards, tokenizers.

Example:
    >>> from dynamo_nb.llm import PreprocessedRequest
    >>> PreprocessedRequest.from_dict({"token_ids": [1, 2]}).token_ids
    [1, 2]
"""

from __future__ import annotations

from .card import (
    CARD_PREFIX,
    MODEL_KINDS,
    ModelCard,
    ModelRuntimeConfig,
    card_from_folder,
    check_model_dir,
    register_llm,
)
from .detokenize import StreamDetokenizer
from .protocol import LLMEngineOutput, PreprocessedRequest, SamplingOptions, StopConditions
from .serve import ReadinessGate, serve_llm
from .tokenizer import ModelTokenizer

__all__ = [
    "CARD_PREFIX",
    "MODEL_KINDS",
    "LLMEngineOutput",
    "ModelCard",
    "ModelRuntimeConfig",
    "ModelTokenizer",
    "PreprocessedRequest",
    "ReadinessGate",
    "SamplingOptions",
    "StopConditions",
    "StreamDetokenizer",
    "card_from_folder",
    "check_model_dir",
    "register_llm",
    "serve_llm",
]
