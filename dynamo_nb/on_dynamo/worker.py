"""An engine served as a worker of NVIDIA Dynamo: built as on our runtime, its model registered
with Dynamo's ``register_model``, its method served with Dynamo's ``serve_endpoint``.

`dynamo_nb.engines.engine_worker.serve_engine` comes here when the runtime is a `DynamoRuntime`
(``--runtime dynamo``), so every engine worker and `dynamo_nb.EngineProgram` takes the flag.

Example::

    runtime = await runtime_from_args(args)               # --runtime dynamo
    worker = await serve_engine(runtime, WorkerRole.from_args(args), model_path, model_name, make_engine)
    worker.announce()      # READY dynamo.backend.generate instance=… address=dynamo+tcp model=tiny-llama
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..llm.register import engine_handler
from ..runtime.program import announce_ready
from .runtime import DynamoEndpoint, DynamoRuntime, DynamoServer

if TYPE_CHECKING:
    from ..disagg.modes import WorkerRole
    from ..engines.base import Engine
    from ..engines.engine_worker import EngineFactory

__all__ = ["DynamoEngineWorker", "serve_engine_on_dynamo"]


@dataclass
class DynamoEngineWorker:
    """A served engine on Dynamo's runtime: the engine, its endpoint, the server and the name
    its model is registered under (what `dynamo_nb.engines.engine_worker.EngineWorker` is on ours)."""

    engine: Engine
    endpoint: DynamoEndpoint
    server: DynamoServer
    model_name: str

    def announce(self) -> None:
        """Print the READY line, as on our runtime: ``READY <endpoint> instance=<id> address=dynamo+tcp model=<name>``."""
        announce_ready(
            str(self.endpoint.path),
            instance=f"{self.server.instance_id:x}",
            address=self.server.address,
            model=self.model_name,
        )


async def serve_engine_on_dynamo(
    runtime: DynamoRuntime,
    role: WorkerRole,
    model_path: Path,
    model_name: str,
    make_engine: EngineFactory,
) -> DynamoEngineWorker:
    """Build the engine (no KV-event sink yet) and serve it on Dynamo's runtime in ``role``
    (aggregated): its model registered as Dynamo's workers do (tokens in, chat and completions,
    the engine's KV block size, context length and ``max_num_seqs``)."""
    if role.mode != "aggregated":
        raise ConfigError(
            f"--runtime dynamo --mode {role.mode}: on Dynamo's runtime the kit serves aggregated workers "
            "so far; run the prefill/decode pair on the kit's runtime (--runtime dynamo_nb)"
        )
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model

    made = make_engine(None)
    engine: Engine = await made if inspect.isawaitable(made) else made
    try:
        endpoint = runtime.endpoint(role.endpoint)
        config = ModelRuntimeConfig()
        if engine.context_length:
            config.context_length = int(engine.context_length)
        if engine.max_num_seqs:
            config.max_num_seqs = int(engine.max_num_seqs)
        options: dict[str, Any] = {}
        if engine.block_size is not None:
            options["kv_cache_block_size"] = int(engine.block_size)
        await register_model(
            ModelInput.Tokens,
            ModelType.Chat | ModelType.Completions,
            endpoint.inner,
            str(model_path),
            model_name,
            worker_type=WorkerType.Aggregated,
            runtime_config=config,
            **options,
        )
        server = await endpoint.serve(engine_handler(engine.generate))
    except BaseException:
        await engine.close()
        raise
    return DynamoEngineWorker(engine, endpoint, server, model_name)
