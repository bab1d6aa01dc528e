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
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..disagg.modes import WorkerRole
from ..errors import ConfigError
from ..llm.card import STRUCTURED_OUTPUT
from ..llm.register import serve_llm
from ..router.kv.kv_events import KvEventPublisher
from ..runtime.distributed import DistributedRuntime
from ..runtime.program import announce_ready
from ..runtime.serving import ServedInstance, ServingEndpoint, ServingRuntime
from .base import Engine, EngineClass, KvEventSink, stats_handler

if TYPE_CHECKING:
    from ..llm.card import ModelCard

__all__ = ["EngineFactory", "EngineWorker", "ServesEngines", "serve_engine"]

EngineFactory = Callable[[KvEventSink | None], "Engine | Awaitable[Engine]"]
"""``make_engine(kv_events)``: builds the engine with its KV-event sink (may be a coroutine)."""


@runtime_checkable
class ServesEngines(Protocol):
    """A runtime that is not the kit's and serves engines its own way (registering the model
    with its own calls): NVIDIA Dynamo's, `dynamo_nb.on_dynamo.DynamoRuntime`. `serve_engine`
    hands such a runtime the engine to serve."""

    async def serve_engine(
        self, role: WorkerRole, model_path: Path, model_name: str, make_engine: EngineFactory
    ) -> EngineWorker: ...


@dataclass
class EngineWorker:
    """A served engine, on whichever runtime: the engine, its endpoint, the server, the name its
    model is served as and, on the kit's runtime, the model card it published (None where the
    runtime registers models its own way)."""

    engine: Engine
    endpoint: ServingEndpoint
    server: ServedInstance
    model_name: str
    card: ModelCard | None = None

    def announce(self) -> None:
        """Print the worker's READY line: ``READY <endpoint> instance=<id> address=<address> model=<name>``."""
        announce_ready(
            str(self.endpoint.path),
            instance=f"{self.server.instance_id:x}",
            address=self.server.address,
            model=self.model_name,
        )


async def serve_engine(
    runtime: ServingRuntime,
    role: WorkerRole,
    model_path: Path,
    model_name: str,
    make_engine: EngineFactory,
) -> EngineWorker:
    """Build the engine with ``make_engine(kv_events)`` and serve it in ``role`` (see the module
    docstring). On NVIDIA Dynamo's runtime (``--runtime dynamo``) the runtime serves it and
    registers its model with Dynamo's calls (a `ServesEngines`:
    `dynamo_nb.on_dynamo.serve_engine_on_dynamo`)."""
    if not isinstance(runtime, DistributedRuntime):
        if isinstance(runtime, ServesEngines):  # another runtime (NVIDIA Dynamo's) serves it its own way
            return await runtime.serve_engine(role, model_path, model_name, make_engine)
        raise ConfigError(
            f"{type(runtime).__name__} serves no engines: run the worker with --runtime dynamo_nb"
        )
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
        if getattr(engine, "enforces_guided_decoding", False):
            # the frontend sends structured-output requests only to workers that enforce them (a
            # prefill worker: its first token drawn under the grammar, which its decode goes on with)
            runtime_config = {**(runtime_config or {}), "extra": {STRUCTURED_OUTPUT: True}}
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
    return EngineWorker(engine, endpoint, server, card.name, card)


if TYPE_CHECKING:
    from .echo import EchoEngine
    from .hf import HFEngine
    from .mocker import MockerEngine
    from .sglang import SglangEngine
    from .upstream import UpstreamEngine
    from .vllm import VllmEngine

    def _every_engine_builds_from_its_flags() -> list[EngineClass]:
        """mypy checks here that each engine of the kit has the `EngineClass` ``from_args``."""
        return [EchoEngine, HFEngine, MockerEngine, SglangEngine, UpstreamEngine, VllmEngine]
