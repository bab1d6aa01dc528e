"""The Engine contract: what every engine implements, and how an engine becomes an endpoint handler.

An engine takes typed requests and streams typed outputs; it never sees the wire. This file is
enough to write one (``EchoEngine`` in ``echo.py`` is the smallest; the conformance suite,
``tests/test_engine_conformance.py``, runs against every engine):

- ``generate(request: PreprocessedRequest, context) -> AsyncIterator[LLMEngineOutput]``: one
  item per new token (or a few), the last with ``finish_reason`` and usage; it stops with
  ``cancelled`` when ``context.is_stopped()``, and refuses (`InvalidRequestError`) what it cannot
  serve, such as a prompt past ``context_length`` (`token_budget` does both sums);
- ``stats() -> dict``: its counters (prefix hits, steps, …), served at ``{ns}.{comp}.stats``;
- ``kv_snapshot() -> list[event]``: the KV events that rebuild its cache from empty (a KV
  router re-syncs from it after a lost event); ``[]`` when it has no cache;
- ``close()``: stop its tasks and release what it holds;
- what the serving code reads, declared (never probed with ``getattr``): ``max_num_seqs``,
  ``block_size``, ``context_length`` (attributes or properties; None where it has none) and
  ``active`` (see `Engine`);
- ``from_args``: a classmethod coroutine, ``await MyEngine.from_args(args, model_path,
  kv_events=sink)``, that builds it whole from its worker's parsed flags (nothing is set on it
  afterwards); a worker program passes it to `dynamo_nb.engines.engine_worker.serve_engine`;
- optionally ``add_args(parser)``, a classmethod adding the flags ``from_args`` reads: an
  `dynamo_nb.EngineProgram` of the class (or of a subclass: a subclass of ``HFEngine`` takes
  ``--device``, ``--dtype`` …) puts them in its parser.

Its KV events go to the `KvEventSink` handed to its constructor (``kv_events=``), never set from
outside. An engine that serves disaggregated requests is also a
`dynamo_nb.disagg.roles.DisaggregatedEngine`: it adds ``prefill``, ``decode``, ``start_bootstrap``,
``handoff_endpoint`` and ``kv_timeout`` (usually by mixing in `dynamo_nb.disagg.prefill.BootstrapRole`).

`dynamo_nb.llm.engine_handler` turns ``engine.generate`` (or ``prefill`` / ``decode``) into an
endpoint handler, and `dynamo_nb.llm.serve_llm` serves it with its model card. An engine that
makes every request's tokens in one step of its own (the mocker) may return a
`dynamo_nb.llm.protocol.EmittingStream` from ``generate``: served, its step then sends each
output itself instead of waking each request's task per token.

Example:
    >>> from dynamo_nb.engines import DisaggregatedEngine, EchoEngine, MockerEngine
    >>> isinstance(EchoEngine(), Engine), isinstance(MockerEngine(), DisaggregatedEngine)
    (True, True)
    >>> isinstance(EchoEngine(), DisaggregatedEngine)
    False
    >>> engine = MockerEngine(max_num_seqs=8)
    >>> engine.max_num_seqs, engine.block_size, engine.context_length, engine.active
    (8, 16, None, 0)
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..llm.limits import check_context
from ..llm.protocol import DEFAULT_MAX_TOKENS, LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from ..settings import Settings, at_least, setting

__all__ = [
    "Engine",
    "EngineClass",
    "EngineLimits",
    "KvEvent",
    "KvEventSink",
    "stats_handler",
    "token_budget",
]

KvEvent = Any
"""One KV event: ``{"stored": {...}}``, ``{"removed": {...}}`` or ``"cleared"`` (see `dynamo_nb.router.kv`)."""

KvEventSink = Callable[[KvEvent], Awaitable[Any]]
"""Where an engine sends its KV events, e.g. a `KvEventPublisher`'s ``publish``."""


@dataclass(frozen=True)
class EngineLimits(Settings):
    """What every engine worker's flags say of its engine, whichever engine it is: tokens per KV
    block and requests running at once (``--kv-cache-block-size``, ``--max-num-seqs``).

    Example:
        >>> EngineLimits(max_num_seqs=0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: max_num_seqs (--max-num-seqs) must be at least 1, got 0
    """

    block_size: int = setting(
        16,
        flag="--kv-cache-block-size",
        check=at_least(1),
        help="tokens per KV block, published in the model card for KV routing",
    )
    max_num_seqs: int = setting(
        64, flag="--max-num-seqs", check=at_least(1), help="requests running at once; more wait"
    )


@runtime_checkable
class Engine(Protocol):
    """What every engine implements (see the module docstring).

    Attributes:
        max_num_seqs: requests it runs at once; None: no limit of its own (it queues inside).
            Its worker publishes it in the model card's runtime config, so the frontend's
            admission control lets in at most the sum over the workers, and the least-loaded
            router skips a worker at its limit.
        block_size: tokens per KV block; its worker publishes it as the card's
            ``kv_cache_block_size``, and KV routers hash prompts in blocks of this size. None:
            it keeps no KV blocks (the card then has the worker's ``--kv-cache-block-size``).
        context_length: the longest prompt + output it serves; None: unbounded or unknown (the
            card then has the model folder's).
        active: requests running or waiting in it now (its stats and ``repr`` say it; tests
            read it to see a cancelled request leave).
    """

    # read by its worker, never set there: read-only members, so an engine may declare them as
    # plain ints (a narrower type) or as properties
    @property
    def max_num_seqs(self) -> int | None: ...

    @property
    def block_size(self) -> int | None: ...

    @property
    def context_length(self) -> int | None: ...

    @property
    def active(self) -> int: ...

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
        return asked if asked is not None else DEFAULT_MAX_TOKENS
    check_context(prompt, None, context_length)  # the prompt alone fills it: refused
    room = context_length - prompt
    return room if asked is None else min(asked, room)


class EngineClass(Protocol):
    """An engine class a worker builds from its flags: its classmethod coroutine ``from_args``
    (every engine of the kit has one; `dynamo_nb.EngineProgram` serves any class that does).
    The flags are the worker's parsed ones, ``model_path`` the model folder they chose, and
    ``kv_events`` where the engine sends its KV events (None: nowhere).

    Example::

        engine = await HFEngine.from_args(args, model_path, kv_events=publisher.publish)
    """

    def from_args(
        self, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> Awaitable[Engine]: ...


def stats_handler(stats: Callable[[], dict[str, Any]]) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    """An endpoint handler answering with ``stats()`` (an engine's counters, such as prefix hits).

    Example::

        await component.endpoint("stats").serve(stats_handler(engine.stats))
    """

    async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        yield stats()

    return handler
