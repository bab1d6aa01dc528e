"""The Engine protocol: what every engine implements, and how an engine becomes an endpoint handler.

An engine takes typed requests and streams typed outputs; it never sees the wire:

- ``generate(request: PreprocessedRequest, context) -> AsyncIterator[LLMEngineOutput]``: one
  item per new token (or a few), the last with ``finish_reason`` and usage;
- ``stats() -> dict``: its counters (prefix hits, steps, …), served at ``{ns}.{comp}.stats``;
- ``kv_snapshot() -> list[event]``: the KV events that rebuild its cache from empty (a KV
  router re-syncs from it after a lost event); ``[]`` when it has no cache;
- ``close()``: stop its tasks and release what it holds.

Its KV events go to a `KvEventSink` handed to its constructor (``kv_events=``), never set from
outside. An engine that serves disaggregated requests is also a
`dynamo_nb.disagg.roles.DisaggregatedEngine`: it adds ``prefill``, ``decode`` and
``start_bootstrap`` (usually by mixing in `dynamo_nb.disagg.roles.BootstrapRole`).

`dynamo_nb.llm.engine_handler` turns ``engine.generate`` (or ``prefill`` / ``decode``) into an
endpoint handler, and `dynamo_nb.llm.serve_llm` serves it with its model card.

Example:
    >>> from dynamo_nb.engines import DisaggregatedEngine, EchoEngine, MockerEngine
    >>> isinstance(EchoEngine(), Engine), isinstance(MockerEngine(), DisaggregatedEngine)
    (True, True)
    >>> isinstance(EchoEngine(), DisaggregatedEngine)
    False
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidRequestError
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context

__all__ = [
    "Engine",
    "KvEvent",
    "KvEventSink",
    "stats_handler",
    "token_budget",
]

KvEvent = Any
"""One KV event: ``{"stored": {...}}``, ``{"removed": {...}}`` or ``"cleared"`` (see `dynamo_nb.router.kv`)."""

KvEventSink = Callable[[KvEvent], Awaitable[Any]]
"""Where an engine sends its KV events, e.g. a `KvEventPublisher`'s ``publish``."""


@runtime_checkable
class Engine(Protocol):
    """What every engine implements (see the module docstring)."""

    def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    def stats(self) -> dict[str, int]: ...

    def kv_snapshot(self) -> list[KvEvent]: ...

    async def close(self) -> None: ...


def token_budget(request: PreprocessedRequest, context_length: int | None) -> int:
    """How many tokens ``request`` may generate: its ``max_tokens``, capped by the context left.

    Raises `InvalidRequestError` when the prompt alone fills the context.

    Example:
        >>> token_budget(PreprocessedRequest(token_ids=[1, 2, 3]), context_length=8)
        5
    """
    prompt = len(request.token_ids)
    asked = request.stop_conditions.max_tokens
    if context_length is None:
        return asked if asked is not None else 16
    room = context_length - prompt
    if room < 1:
        raise InvalidRequestError(
            f"the prompt is {prompt} tokens and the model's context is {context_length}: shorten the prompt",
            param="messages",
        )
    return room if asked is None else min(asked, room)


def stats_handler(stats: Callable[[], dict[str, Any]]) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    """An endpoint handler answering with ``stats()`` (an engine's counters, such as prefix hits).

    Example::

        await component.endpoint("stats").serve(stats_handler(engine.stats))
    """

    async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        yield stats()

    return handler
