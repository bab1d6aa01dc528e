"""Engines: what runs the model behind a worker endpoint, all behind one `Engine` protocol.

- ``base.py``: the `Engine` protocol, the KV-event sink, token budget (`DisaggregatedEngine`, the
  prefill and decode roles, is `dynamo_nb.disagg.roles`');
- ``echo.py``: `EchoEngine`, zero cost, streams the prompt back (measures everything but the model);
- ``hf.py``: `HFEngine`, a local Hugging Face model with PyTorch + transformers (the ``hf`` extra),
  batched continuously by its step scheduler, ``hf_scheduler.py``; a step's parts: ``hf_batch.py`` (the decoding sequences as one batch kept
  across steps), ``hf_prefill.py`` (the step's prompt chunks, planned and run in one forward pass)
  ``hf_sampling.py`` (every row's next token sampled on the device) and ``hf_grammar.py`` (a
  structured-output request's logits row masked by its llguidance grammar);
- ``mocker.py``: `MockerEngine`, a simulated vLLM-style scheduler with a KV block manager and
  Dynamo's timing model, for routing experiments at scale; ``mocker_scheduler.py``: its scheduler,
  with no clock of its own (`dynamo_nb.replay` runs it on a simulated one); ``mocker_timing.py``:
  its step times (Dynamo's curves, or fitted to a profile of a measured engine, Dynamo's layout);
- ``vllm.py``: `VllmEngine`, vLLM's ``AsyncLLM`` (the ``vllm`` extra), prefill/decode through
  vLLM's KV connector;
- ``sglang.py``: `SglangEngine`, ``sglang.Engine`` (the ``sglang`` extra, on a GPU) with SGLang's
  bootstrap-room disaggregation; ``sglang_fake.py``: its recording stand-in (no GPU needed);
- ``upstream.py``: `UpstreamEngine`, a running OpenAI-compatible server (``vllm serve``, SGLang's
  server, another kit frontend) as an engine: token ids in and out, cancellation and the
  server's own errors passed through;
- ``conformance.py``: `check_engine`, the contract's checks, run on any engine from a cell;
- ``engine_worker.py``: `serve_engine`, an engine served as a worker from its flags (its role, KV
  events, model card, stats endpoint);
- ``model_calls.py``: `forward_with_cache`, a transformers forward pass with a KV cache that
  runs without deprecation warnings on every transformers release we support;
- ``kv_cache/``: the block manager (prefix reuse, LRU eviction, KV events), the ``hf``
  engine's prefix cache of KV tensors, and the relay of vLLM's and SGLang's ZMQ KV events.

A new engine implements `Engine` (and `DisaggregatedEngine` for prefill/decode roles); serve it
with `dynamo_nb.llm.serve_llm(endpoint, engine.generate, model_path)`.

Example:
    >>> from dynamo_nb.engines import EchoEngine, Engine
    >>> isinstance(EchoEngine(), Engine)
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..disagg.roles import DisaggregatedEngine
from .base import Engine, KvEvent, KvEventSink, stats_handler, token_budget
from .conformance import ConformanceReport, check_engine
from .echo import EchoEngine
from .mocker import MockerEngine
from .model_calls import forward_with_cache, new_kv_cache
from .upstream import UpstreamEngine

if TYPE_CHECKING:
    from .hf import HFEngine
    from .sglang import SglangEngine
    from .vllm import VllmEngine

__all__ = [
    "ConformanceReport",
    "DisaggregatedEngine",
    "EchoEngine",
    "Engine",
    "HFEngine",
    "KvEvent",
    "KvEventSink",
    "MockerEngine",
    "SglangEngine",
    "UpstreamEngine",
    "VllmEngine",
    "check_engine",
    "forward_with_cache",
    "new_kv_cache",
    "stats_handler",
    "token_budget",
]


def __getattr__(name: str) -> Any:  # HFEngine (torch), VllmEngine, SglangEngine import only when asked for
    if name == "HFEngine":
        from .hf import HFEngine

        return HFEngine
    if name == "VllmEngine":
        from .vllm import VllmEngine

        return VllmEngine
    if name == "SglangEngine":
        from .sglang import SglangEngine

        return SglangEngine
    raise AttributeError(name)
