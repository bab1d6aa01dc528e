"""An engine served as a worker of NVIDIA Dynamo: built as on our runtime, its model registered
with Dynamo's ``register_model``, its method served with Dynamo's ``serve_endpoint``.

`dynamo_nb.engines.engine_worker.serve_engine` comes here when the runtime is a `DynamoRuntime`
(``--runtime dynamo``: its `DynamoRuntime.serve_engine`), so every engine worker and
`dynamo_nb.EngineProgram` takes the flag.

Example::

    runtime = await runtime_from_args(args)               # --runtime dynamo
    worker = await serve_engine(runtime, WorkerRole.from_args(args), model_path, model_name, make_engine)
    worker.announce()      # READY dynamo.backend.generate instance=… address=dynamo+tcp model=tiny-llama
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..disagg.decode import DecodeHandler
from ..disagg.roles import DisaggregatedEngine
from ..engines.base import stats_handler
from ..engines.engine_worker import EngineWorker
from ..errors import ConfigError, InvalidRequestError
from ..llm.guided import GUIDED_KINDS
from ..llm.register import engine_handler
from ..runtime.streams import closing
from .kv_publisher import DynamoKvEvents

if TYPE_CHECKING:
    from ..disagg.modes import WorkerRole
    from ..engines.base import Engine
    from ..engines.engine_worker import EngineFactory
    from .runtime import DynamoRuntime

__all__ = ["log_handoff", "serve_engine_on_dynamo", "with_guided_decoding", "with_handoff_token"]

logger = logging.getLogger(__name__)


async def serve_engine_on_dynamo(
    runtime: DynamoRuntime,
    role: WorkerRole,
    model_path: Path,
    model_name: str,
    make_engine: EngineFactory,
) -> EngineWorker:
    """Build the engine (its KV events going to Dynamo's KV publisher: `DynamoKvEvents`) and
    serve it on Dynamo's runtime in ``role``,
    its model registered as Dynamo's workers register theirs (tokens in; the engine's KV block
    size, context length and ``max_num_seqs``):

    - ``aggregated``: chat and completions, ``WorkerType.Aggregated``;
    - ``prefill``: ``engine.prefill``, ``ModelType.Prefill``, ``WorkerType.Prefill`` needing a
      decode; its bootstrap server published with ``set_disaggregated_endpoint(host, port)``;
    - ``decode``: ``engine.decode`` behind a `dynamo_nb.disagg.decode.DecodeHandler`, chat and
      completions, ``WorkerType.Decode`` needing a prefill.

    Dynamo's frontend sends both legs at once, each with the same ``bootstrap_info`` and a
    ``handoff_id`` (16 random bytes) in it but no ``bootstrap_token``: the room's token both legs
    use is that ``handoff_id`` (`with_handoff_token`). At ``--log-level debug`` each leg logs its
    room and a fingerprint of that token (`log_handoff`), so a reader can match the two legs of a
    request across the prefill's and the decode's logs."""
    from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model

    endpoint = runtime.endpoint(role.endpoint)
    # to Dynamo's KV router (python -m dynamo.frontend --router-mode kv), where nothing listens unasked
    kv_events = DynamoKvEvents(endpoint, enabled=runtime.planes.kv_events_allowed)
    made = make_engine(kv_events)
    engine: Engine = await made if inspect.isawaitable(made) else made
    try:
        config = ModelRuntimeConfig()
        if engine.context_length:
            config.context_length = int(engine.context_length)
        if engine.max_num_seqs:
            config.max_num_seqs = int(engine.max_num_seqs)
        if runtime.tool_call_parser is not None:
            config.tool_call_parser = runtime.tool_call_parser  # Dynamo's frontend reads the calls
        options: dict[str, Any] = {}
        if engine.block_size is not None:
            options["kv_cache_block_size"] = int(engine.block_size)
            kv_events.start(engine.block_size)  # before serving: routers subscribe meanwhile
            if not kv_events.enabled:
                logger.warning(
                    "KV events are not published, so Dynamo's KV router (--router-mode kv) cannot see this "
                    "engine's cache: Dynamo's ZMQ event plane would listen on every interface (0.0.0.0) with "
                    "no authentication. Give --nats-url nats://HOST:PORT (NATS carries them; nothing listens "
                    "here), or --allow-unauthenticated on a network you trust"
                )
        model_type = ModelType.Chat | ModelType.Completions
        if role.mode == "aggregated":
            method, options["worker_type"] = engine.generate, WorkerType.Aggregated
        elif not isinstance(engine, DisaggregatedEngine):
            raise ConfigError(
                f"--mode {role.mode}: {type(engine).__name__} has no prefill and decode roles; implement "
                "DisaggregatedEngine (mix in dynamo_nb.disagg.BootstrapRole) or run it with --mode aggregated"
            )
        elif role.mode == "prefill":
            host = role.bootstrap_host or runtime.planes.environment["DYN_TCP_RPC_HOST"]
            bootstrap = await engine.start_bootstrap(
                host, role.bootstrap_port, ttl=role.kv_ttl, advertise_host=role.bootstrap_advertise_host
            )
            published = bootstrap.endpoint
            config.set_disaggregated_endpoint(published["bootstrap_host"], int(published["bootstrap_port"]))
            method = engine.prefill
            model_type, options["worker_type"] = ModelType.Prefill, WorkerType.Prefill
            options["needs"] = [[WorkerType.Decode]]
        else:  # decode
            method = DecodeHandler(engine, None).generate
            options["worker_type"], options["needs"] = WorkerType.Decode, [[WorkerType.Prefill]]
        await register_model(
            ModelInput.Tokens,
            model_type,
            endpoint.inner,
            str(model_path),
            model_name,
            runtime_config=config,
            **options,
        )
        handler = engine_handler(method)

        enforces = bool(getattr(engine, "enforces_guided_decoding", False))

        async def generate(request: Any, context: Any = None) -> AsyncIterator[Any]:
            request = with_guided_decoding(with_handoff_token(request), enforces=enforces)
            log_handoff(request, role.mode)
            async with closing(handler(request, context)) as items:
                async for item in items:
                    yield item

        server = await endpoint.serve(generate)
        path = endpoint.path  # {ns}.{comp}.stats: the engine's counters, as on the kit's runtime
        await runtime.endpoint(f"{path.namespace}.{path.component}.stats").serve(
            stats_handler(lambda: {**engine.stats(), "kv_blocks_published": kv_events.stored_blocks})
        )
    except BaseException:
        await engine.close()
        raise
    return EngineWorker(engine, endpoint, server, model_name)


def with_handoff_token(request: Any) -> Any:
    """``request`` with its ``bootstrap_info.bootstrap_token`` set to the hex of Dynamo's
    ``handoff_id`` when it has one and no token: the per-room secret Dynamo's frontend gives
    both legs of a disaggregated request.

    Example:
        >>> with_handoff_token({"bootstrap_info": {"bootstrap_room": 5, "handoff_id": [1, 255]}})
        {'bootstrap_info': {'bootstrap_room': 5, 'handoff_id': [1, 255], 'bootstrap_token': '01ff'}}
        >>> with_handoff_token({"token_ids": [1]})
        {'token_ids': [1]}
    """
    info = request.get("bootstrap_info") if isinstance(request, dict) else None
    if not isinstance(info, dict) or info.get("bootstrap_token") is not None:
        return request
    handoff = info.get("handoff_id")
    if isinstance(handoff, (bytes, bytearray)):
        token = bytes(handoff).hex()
    elif isinstance(handoff, list) and all(isinstance(b, int) and 0 <= b < 256 for b in handoff):
        token = bytes(handoff).hex()
    elif isinstance(handoff, str) and handoff:
        token = handoff
    else:
        return request
    return {**request, "bootstrap_info": {**info, "bootstrap_token": token}}


def log_handoff(request: Any, leg: str) -> None:
    """Log (debug) a disaggregated leg's bootstrap room and a fingerprint of its token (the first
    8 hex digits of the token's SHA-256): the two legs of a request log the same one, so a reader
    can match them across the prefill's and the decode's logs, and nothing of the token itself
    is written.

    Example:
        >>> import logging
        >>> handler = logging.StreamHandler(__import__("sys").stdout)
        >>> handler.setFormatter(logging.Formatter("%(message)s"))
        >>> logger.addHandler(handler); logger.setLevel(logging.DEBUG)
        >>> log_handoff({"bootstrap_info": {"bootstrap_room": 5, "bootstrap_token": "01ff"}}, "decode")
        decode leg of bootstrap room 5: token fingerprint fcd9a6e1 (its own token)
        >>> log_handoff({"token_ids": [1]}, "aggregated")  # no room: nothing logged
        >>> logger.removeHandler(handler); logger.setLevel(logging.NOTSET)
    """
    if not logger.isEnabledFor(logging.DEBUG):  # every request passes here: nothing more unless asked
        return
    info = request.get("bootstrap_info") if isinstance(request, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("bootstrap_token"), str):
        return
    fingerprint = hashlib.sha256(info["bootstrap_token"].encode()).hexdigest()[:8]
    source = "from Dynamo's handoff_id" if info.get("handoff_id") is not None else "its own token"
    logger.debug(
        "%s leg of bootstrap room %s: token fingerprint %s (%s)",
        leg,
        info.get("bootstrap_room"),
        fingerprint,
        source,
    )


def with_guided_decoding(request: Any, *, enforces: bool) -> Any:
    """``request`` with the structured output Dynamo's frontend asks for (its
    ``sampling_options.guided_decoding``: ``json`` for ``response_format`` and for a forced tool
    call, ``regex``, ``choice``, ``grammar``) as the kit's ``guided_decoding``, which the hf
    engine and the vLLM worker enforce. An engine that does not (``enforces`` false) refuses it,
    rather than answer unconstrained.

    Example:
        >>> with_guided_decoding({"sampling_options": {"guided_decoding": {"json": {"type": "object"}}}},
        ...                      enforces=True)["guided_decoding"]
        {'kind': 'json', 'spec': {'type': 'object'}, 'field': 'response_format'}
        >>> with_guided_decoding({"token_ids": [1]}, enforces=False)
        {'token_ids': [1]}
    """
    sampling = request.get("sampling_options") if isinstance(request, dict) else None
    asked = sampling.get("guided_decoding") if isinstance(sampling, dict) else None
    if not isinstance(asked, dict) or request.get("guided_decoding") is not None:
        return request
    kind = next((kind for kind in GUIDED_KINDS if asked.get(kind) is not None), None)
    if kind is None:
        return request
    if not enforces:
        raise InvalidRequestError(
            "response_format: this worker's engine does not enforce structured output; serve the model with "
            "the hf engine or vLLM's, or leave the field out",
            "response_format",
        )
    return {**request, "guided_decoding": {"kind": kind, "spec": asked[kind], "field": "response_format"}}
