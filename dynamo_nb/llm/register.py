"""Serve an LLM engine and register its model: what every LLM worker does.

- `engine_handler`: an engine method (typed `PreprocessedRequest` in, `LLMEngineOutput` out)
  as an endpoint handler (dicts on the wire);
- `register_llm` / `publish_card`: publish the model card of a served endpoint, so frontends
  serve the model (Dynamo's ``register_llm``);
- `serve_llm`: both, in the order that loses no request: the endpoint serves at once behind a
  `ReadinessGate` that holds early requests until the card is published;
- `model_from_args`: the model folder and name a worker's ``--model-path`` / ``--model-name`` give.

Example::

    engine = await HFEngine.load(tiny_model_path())
    server, card = await serve_llm(endpoint, engine.generate, tiny_model_path(), model_name="tiny")
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import ConfigError, NotReadyError
from ..models.folders import model_folder
from ..runtime.context import Context
from ..runtime.server import EndpointServer, Handler, adapt_handler
from ..runtime.streams import closing
from .card import (
    DEFAULT_KV_BLOCK_SIZE,
    ModelCard,
    ModelRuntimeConfig,
    card_from_folder,
    card_key,
)
from .limits import RequestLimits
from .protocol import EmittingStream, LLMEngineOutput, PreprocessedRequest

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..runtime.distributed import Endpoint

__all__ = [
    "CardOptions",
    "EngineMethod",
    "ReadinessGate",
    "engine_handler",
    "llm_card",
    "model_from_args",
    "publish_card",
    "register_llm",
    "serve_llm",
    "unpublish_cards",
]

logger = logging.getLogger("dynamo_nb.llm")

EngineMethod = Callable[[PreprocessedRequest, "Context | None"], AsyncIterator[LLMEngineOutput]]
"""``engine.generate`` (or ``prefill`` / ``decode``): a typed request in, typed outputs out."""


def engine_handler(
    method: EngineMethod, limits: RequestLimits | None = None, *, emit: bool = False
) -> Callable[..., AsyncIterator[dict[str, Any]]]:
    """The endpoint handler of an engine method: request dict → `PreprocessedRequest` (a bad one,
    or one past ``limits``, is an `InvalidRequestError`: a 400 at the frontend, raised before
    the engine sees it), each output → its dict.

    Closing the stream (the caller left, or cancelled) closes the engine's stream at once, so
    the engine frees the request's state.

    ``emit=True`` (what `serve_llm` serves): an engine whose stream is an `EmittingStream` sends
    its outputs through the server's ``context.emit`` from its own step, and the handler yields
    nothing. Only for a handler the server drives itself: a wrapper that reads the handler's
    items would see none, so the default iterates every engine's stream.

    Example:
        >>> import asyncio
        >>> from dynamo_nb.engines import EchoEngine
        >>> handler = engine_handler(EchoEngine().generate)
        >>> async def run():
        ...     return [item async for item in handler({"token_ids": [7, 8], "stop_conditions": {"max_tokens": 2}})]
        >>> [item["token_ids"] for item in asyncio.run(run())]
        [[7], [8]]
    """

    async def handler(request: Any, context: Context | None = None) -> AsyncIterator[dict[str, Any]]:
        parsed = PreprocessedRequest.from_dict(request)
        if limits is not None:
            limits.check(parsed)
        async with closing(method(parsed, context)) as outputs:
            # (a context of our own, set by a server; `dynamo_nb.compat`'s wraps one and keeps
            # Dynamo's stop semantics by iterating)
            send = context.emit if emit and type(context) is Context else None
            if send is not None and isinstance(outputs, EmittingStream):
                await outputs.emit_to(send)  # the engine sends each output itself
                return
            async for output in outputs:
                yield output.to_dict()

    handler.__qualname__ = f"engine_handler({getattr(method, '__qualname__', method)})"
    return handler


class ReadinessGate:
    """Holds the requests that reach a worker before its registration is complete.

    The endpoint serves at once, so it is reachable while its model card is still being
    published; a request that comes in that window waits (at most ``timeout`` seconds) for
    `open` instead of being refused or lost (then `NotReadyError`, a 503).

    Example::

        gate = ReadinessGate(engine_handler(engine.generate))
        server = await endpoint.serve(gate.handle)
        await register_llm(endpoint, model_path)
        gate.open()
    """

    def __init__(self, handler: Handler, timeout: float = 30.0) -> None:
        self._call = adapt_handler(handler)
        self._ready = asyncio.Event()
        self.timeout = timeout
        self.held_total = 0

    def open(self) -> None:
        """Registration is done: let held and new requests through."""
        self._ready.set()

    async def handle(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """The handler to serve: waits for `open`, then runs the wrapped handler."""
        if not self._ready.is_set():
            self.held_total += 1
            try:
                await asyncio.wait_for(self._ready.wait(), self.timeout)
            except asyncio.TimeoutError:
                raise NotReadyError(
                    f"this worker's registration did not complete within {self.timeout:g} s; retry later"
                ) from None
        async with closing(self._call(request, context)) as items:  # closed with this stream
            async for item in items:
                yield item


class CardOptions(TypedDict, total=False):
    """What `register_llm` and `serve_llm` put in the model card besides the folder's own config."""

    model_name: str | None  # the served name (default: the folder's name)
    kind: (
        list[str] | tuple[str, ...] | str | None
    )  # chat, completions, prefill, decode (default: by template)
    kv_cache_block_size: int  # for KV routing (default 16)
    runtime_config: ModelRuntimeConfig | dict[str, Any] | None  # e.g. a prefill's disaggregated_endpoint
    context_length: int | None  # overrides the model config's


def llm_card(endpoint: Endpoint, model_path: str | Path, **options: Unpack[CardOptions]) -> ModelCard:
    """The model card of ``endpoint`` for the model in ``model_path`` (the folder is checked)."""
    return card_from_folder(
        model_path,
        name=options.get("model_name"),
        endpoint=str(endpoint.path),
        kinds=options.get("kind"),
        kv_cache_block_size=options.get("kv_cache_block_size", DEFAULT_KV_BLOCK_SIZE),
        runtime_config=options.get("runtime_config"),
        context_length=options.get("context_length"),
    )


async def register_llm(
    endpoint: Endpoint, model_path: str | Path, **options: Unpack[CardOptions]
) -> ModelCard:
    """Publish the model card of ``endpoint``'s instance so that frontends serve the model.

    ``kind``: ``"chat"``, ``"completions"``, ``"prefill"`` or a list (default: chat and completions,
    or completions only when the tokenizer has no chat template); the other options are
    `CardOptions`. Serve the endpoint first; the card lives as long as that instance. With
    static discovery nothing is published (the frontend builds the card from its own flags)
    and the card is only returned.

    Example::

        server = await endpoint.serve(engine_handler(engine.generate))
        card = await register_llm(endpoint, tiny_model_path(), model_name="tiny")
    """
    return await publish_card(endpoint, llm_card(endpoint, model_path, **options))


async def publish_card(endpoint: Endpoint, card: ModelCard) -> ModelCard:
    """Publish a built ``card`` for ``endpoint``'s instance (see `register_llm`)."""
    runtime = endpoint.runtime
    # the newest server of the path: with two serving it in one runtime, the one just started
    server = next((s for s in reversed(runtime.servers) if s.endpoint.path == endpoint.path), None)
    if server is None:
        raise ConfigError(
            f"{endpoint.path} is not served by this runtime: `await endpoint.serve(handler)` first, "
            "then register_llm(endpoint, ...)"
        )
    card.instance_id = server.instance_id
    if runtime.is_static:
        logger.info("static discovery: model card for %s not published", card.name)
        return card
    await runtime.put_instance_key(server, card_key(endpoint.path, server.instance_id), card.to_json())
    logger.info("registered model %s at %s (instance %x)", card.name, endpoint.path, server.instance_id)
    return card


async def unpublish_cards(endpoint: Endpoint) -> None:
    """Take the model cards of ``endpoint``'s instances in this runtime out of discovery:
    frontends stop sending them requests for the model, while the endpoint goes on serving.

    Example::

        await unpublish_cards(endpoint)   # e.g. before the engine sleeps; register_llm again after
    """
    runtime = endpoint.runtime
    for server in [s for s in runtime.servers if s.endpoint.path == endpoint.path]:
        await runtime.delete_instance_key(server, card_key(endpoint.path, server.instance_id))


async def serve_llm(
    endpoint: Endpoint, method: EngineMethod, model_path: str | Path, **options: Unpack[CardOptions]
) -> tuple[EndpointServer, ModelCard]:
    """Serve the engine ``method`` (e.g. ``engine.generate``) at ``endpoint`` and publish its
    model card (not with static discovery); ``options`` are `register_llm`'s (`CardOptions`).

    The card is built (and the folder checked) first, so a bad option publishes nothing. The
    endpoint then serves, behind a `ReadinessGate`: a request that reaches it before the card
    is published waits for the registration instead of being refused. Each request is checked
    against the model's vocabulary and the card's context (`RequestLimits`) before the engine
    sees it.

    Example::

        engine = await HFEngine.load(tiny_model_path())
        server, card = await serve_llm(endpoint, engine.generate, tiny_model_path(), model_name="tiny")
    """
    card = llm_card(endpoint, model_path, **options)
    # a request past the model's vocabulary or context is refused before the engine sees it
    limits = RequestLimits.of_model(model_path, card.context_length)
    handler = engine_handler(method, limits, emit=True)
    gate = ReadinessGate(handler)  # requests that come before the card is out wait for it
    server = await endpoint.serve(gate.handle)
    try:
        await publish_card(endpoint, card)
    except BaseException:
        await server.stop(grace=0)
        raise
    gate.open()
    server.serve_with(handler)  # the gate has nothing more to hold: new requests skip it
    return server, card


def model_from_args(args: argparse.Namespace) -> tuple[Path, str]:
    """The model folder and served name that ``--model-path`` and ``--model-name`` give: the
    built-in tiny model (built on first use) and ``tiny-llama`` unless they are set.

    Example:
        >>> model_from_args(argparse.Namespace(model_path="/no/such", model_name=None))
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: --model-path '/no/such' is not a directory: ...
    """
    return model_folder(args.model_path, args.model_name)
