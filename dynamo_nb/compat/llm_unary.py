"""Dynamo's unary LLM helpers (``dynamo.llm.LLMUnaryClient``, ``UnaryChatModel``,
``with_engine_data``): a token-generation stream collected into one terminal response, and an
application's unary handler published as a chat model.

``LLMUnaryClient.complete`` sends a `PreprocessedRequest`-shaped dict (token ids, stop
conditions, sampling options) and returns the stream's last item with every generated token id
in ``token_ids``. It refuses ``n`` other than 1 and log probabilities (``ValueError``), and a
stream that breaks the shape (``RuntimeError``), as Dynamo does. One difference: an item without
``index`` counts as choice 0 (dynamo_nb's engines do not send it; Dynamo's do).

Example::

    client = await LLMUnaryClient.connect(runtime, "dynamo.backend.generate")
    done = await client.complete({"token_ids": [1, 45, 33], "stop_conditions": {"max_tokens": 8},
                                  "sampling_options": {"temperature": 0}})
    done["token_ids"], done["finish_reason"]     # eight ids, "length"
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .llm_register import ModelInput, ModelType, WorkerType, register_model
from .runtime.unary import serve_unary_endpoint

__all__ = ["LLMUnaryClient", "UnaryChatModel", "with_engine_data"]


@dataclass(frozen=True)
class UnaryChatModel:
    """An application's unary handler, published as chat model ``public_model_name`` (default:
    ``service_name``) from ``<service_name>.app.generate``; ``chat_template`` is accepted and
    ignored (the frontend uses the model folder's template)."""

    model_path: str
    service_name: str
    public_model_name: str | None = None
    chat_template: Path | None = None

    async def serve(self, runtime: Any, handler: Callable[..., Awaitable[Any]]) -> None:
        """Register the model, then serve ``handler`` until the runtime shuts down."""
        endpoint = runtime.endpoint(f"{self.service_name}.app.generate")
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat,
            endpoint,
            self.model_path,
            model_name=self.public_model_name or self.service_name,
            worker_type=WorkerType.Aggregated,
        )
        await serve_unary_endpoint(endpoint, handler)


class LLMUnaryClient:
    """One terminal response per generation request, by round robin over a Dynamo client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    @classmethod
    async def connect(cls, runtime: Any, endpoint_name: str) -> LLMUnaryClient:
        """A client of ``endpoint_name`` (``ns.comp.ep``) once an instance serves it."""
        client = await runtime.endpoint(endpoint_name).client()
        await client.wait_for_instances()
        return cls(client)

    async def complete(self, request: Mapping[str, Any], *, context: Any = None) -> dict[str, Any]:
        """The last item of the generation, with every token id of the stream in ``token_ids``."""
        _check_request(request)
        stream = await self._client.round_robin(dict(request), annotated=False, context=context)
        return await _collect(stream)


def with_engine_data(completion: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``completion`` with ``values`` added to its ``engine_data`` (a key already there
    is a ``ValueError``).

    Example:
        >>> with_engine_data({"token_ids": [5], "engine_data": {"a": 1}}, {"b": 2})["engine_data"]
        {'a': 1, 'b': 2}
    """
    if not isinstance(completion, Mapping):
        raise ValueError("LLM completion must be an object")
    if not isinstance(values, Mapping):
        raise ValueError("engine_data values must be an object")
    merged = dict(completion)
    if not values:
        return merged
    existing = completion.get("engine_data") or {}
    if not isinstance(existing, Mapping):
        raise ValueError("existing engine_data must be an object")
    taken = sorted(set(existing) & set(values))
    if taken:
        raise ValueError(f"engine_data already contains keys: {', '.join(map(repr, taken))}")
    merged["engine_data"] = {**existing, **values}
    return merged


def _check_request(request: Mapping[str, Any]) -> None:
    if not isinstance(request, Mapping):
        raise ValueError("LLM request must be an object")
    sampling = request.get("sampling_options") or {}
    output = request.get("output_options") or {}
    if not isinstance(sampling, Mapping) or not isinstance(output, Mapping):
        raise ValueError("sampling_options and output_options must be objects")
    if sampling.get("n") not in (None, 1):
        raise ValueError("LLMUnaryClient requires n=1")
    if output.get("logprobs") is not None or output.get("prompt_logprobs") is not None:
        raise ValueError("LLMUnaryClient does not support logprobs")


async def _collect(stream: Any) -> dict[str, Any]:
    token_ids: list[int] = []
    terminal: dict[str, Any] | None = None
    iterator = stream.__aiter__()
    try:
        async for item in iterator:
            if terminal is not None:
                raise RuntimeError("LLM endpoint returned data after terminal")
            if not isinstance(item, Mapping):
                raise RuntimeError("LLM endpoint returned a non-object chunk")
            if item.get("index", 0) != 0:
                raise RuntimeError("LLM endpoint requires choice index 0")
            ids = item.get("token_ids")
            if not isinstance(ids, list) or not all(type(token) is int for token in ids):
                raise RuntimeError("LLM endpoint returned invalid token_ids")
            token_ids.extend(ids)
            if item.get("finish_reason") is not None:
                terminal = dict(item)
        if terminal is None:
            raise RuntimeError("LLM endpoint returned no terminal chunk")
        terminal["token_ids"] = token_ids
        return terminal
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
