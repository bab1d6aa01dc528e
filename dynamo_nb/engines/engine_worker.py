"""An engine served as a worker, from its flags: the role, KV events, the model card, the stats endpoint.

Every engine worker (``components/hf_worker.py``, ``components/mocker_worker.py``,
``python -m dynamo_nb run``) takes the same steps, in this order:

1. its ``--mode`` role (`dynamo_nb.disagg.modes.WorkerRole`, built from its flags in ``main``):
   which endpoint it serves and what its card says;
2. a `KvEventPublisher` on that endpoint's component (when the runtime has an event plane),
   handed to the engine as its KV-event sink; ``kv_sync`` then serves the engine's snapshot;
3. the role's method served behind a readiness gate and the model card published
   (`dynamo_nb.llm.serve_llm`);
4. ``{ns}.{comp}.stats`` serving the engine's counters.

The card says what the engine declares (`dynamo_nb.engines.base.Engine`): its ``block_size``,
``context_length`` and ``max_num_seqs``.

Example::

    runtime = await runtime_from_args(args)
    worker = await serve_engine(
        runtime, WorkerRole.from_args(args), model_path, model_name,
        lambda kv_events: HFEngine.from_args(args, model_path, kv_events=kv_events),
    )
    worker.announce()       # READY dynamo.backend.generate instance=… address=… model=tiny-llama
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..disagg.modes import WorkerRole
from ..llm.register import serve_llm
from ..router.kv.kv_events import KvEventPublisher
from ..runtime.program import announce_ready
from .base import Engine, KvEventSink, stats_handler

if TYPE_CHECKING:
    from ..llm.card import ModelCard
    from ..runtime.distributed import DistributedRuntime, Endpoint
    from ..runtime.server import EndpointServer

__all__ = ["EngineWorker", "serve_engine", "serve_engines_on"]

EngineFactory = Callable[[KvEventSink | None], "Engine | Awaitable[Engine]"]
"""``make_engine(kv_events)``: builds the engine with its KV-event sink (may be a coroutine)."""


EngineServer = Callable[..., Awaitable[Any]]
"""Serves an engine on another runtime: ``(runtime, role, model_path, model_name, make_engine)``."""
_OTHER_RUNTIMES: dict[type, EngineServer] = {}


def serve_engines_on(runtime_type: type, serve: EngineServer) -> None:
    """Serve engines on runtimes of ``runtime_type`` with ``serve`` (another runtime's way of
    registering a model and serving it: `dynamo_nb.on_dynamo` registers NVIDIA Dynamo's when it
    is imported). `serve_engine` then hands such a runtime to it.

    Example::

        serve_engines_on(DynamoRuntime, serve_engine_on_dynamo)
    """
    _OTHER_RUNTIMES[runtime_type] = serve


@dataclass
class EngineWorker:
    """A served engine: the engine, its endpoint, the server and the published model card."""

    engine: Engine
    endpoint: Endpoint
    server: EndpointServer
    card: ModelCard

    def announce(self) -> None:
        """Print the worker's READY line: ``READY <endpoint> instance=<id> address=<address> model=<name>``."""
        announce_ready(
            str(self.endpoint.path),
            instance=f"{self.server.instance_id:x}",
            address=self.server.address,
            model=self.card.name,
        )


async def serve_engine(
    runtime: DistributedRuntime,
    role: WorkerRole,
    model_path: Path,
    model_name: str,
    make_engine: EngineFactory,
) -> EngineWorker:
    """Build the engine with ``make_engine(kv_events)`` and serve it in ``role`` (see the module
    docstring). On NVIDIA Dynamo's runtime (``--runtime dynamo``) the engine is served and its
    model registered with Dynamo's calls (`dynamo_nb.on_dynamo.serve_engine_on_dynamo`)."""
    serve_elsewhere = _OTHER_RUNTIMES.get(type(runtime))
    if serve_elsewhere is not None:  # another runtime (NVIDIA Dynamo's) serves it its own way
        # an EngineWorker in all but type
        return await serve_elsewhere(runtime, role, model_path, model_name, make_engine)
    endpoint = runtime.endpoint(role.endpoint)
    publisher = await KvEventPublisher.for_worker(runtime, endpoint.component())
    made = make_engine(publisher.publish if publisher is not None else None)
    engine = await made if inspect.isawaitable(made) else made
    try:
        if publisher is not None:
            await publisher.serve_sync(engine.kv_snapshot)
        method, runtime_config = await role.method(runtime, engine)
        if engine.max_num_seqs:  # the frontend's admission control and least-loaded router read it
            runtime_config = {**(runtime_config or {}), "max_num_seqs": engine.max_num_seqs}
        card_options: dict[str, Any] = {"context_length": engine.context_length}
        if engine.block_size is not None:  # else the card's default (the engine keeps no KV blocks)
            card_options["kv_cache_block_size"] = engine.block_size
        server, card = await serve_llm(
            endpoint,
            method,
            model_path,
            model_name=model_name,
            kind=role.kinds,
            runtime_config=runtime_config,
            **card_options,
        )
        await endpoint.component().endpoint("stats").serve(stats_handler(engine.stats))  # prefix hits
    except BaseException:
        await engine.close()
        raise
    return EngineWorker(engine, endpoint, server, card)
