"""The ``sglang`` engine: ``sglang.Engine`` behind the Engine protocol, with SGLang's own
bootstrap disaggregation (SGLang 0.5.23; it needs a CUDA GPU).

Token ids in, token deltas out: each request is one ``Engine.async_generate(input_ids=...,
sampling_params=..., stream=True, rid=...)`` call. The engine starts SGLang with
``skip_tokenizer_init`` (the frontend tokenizes) and ``incremental_streaming_output`` (each
item carries only the new ``output_ids``); it also reads SGLang's cumulative items (the
default of ``async_generate``) by slicing off what it already sent. Our sampling options and
stop conditions become SGLang's ``sampling_params`` (`sampling_params_of`), SGLang's
``meta_info.finish_reason`` types ours (``abort`` → ``cancelled`` when we aborted, else an
error). Closing a stream calls ``tokenizer_manager.abort_request(rid=...)``, so SGLang's
scheduler drops the request.

Disaggregated serving the SGLang way (``--disaggregation-mode prefill|decode``; Dynamo's fast
path): SGLang's prefill engine runs a bootstrap server on ``--disaggregation-bootstrap-port``,
which the prefill worker publishes as its card's ``disaggregated_endpoint``. ``prefill`` takes
the router's ``bootstrap_info.bootstrap_room`` (or draws a room), yields ``disaggregated_params``
{host, port, room} first, then runs SGLang's prefill with them; ``decode`` passes the same
triple to SGLang's decode engine, and the two engines move the KV between them (NIXL or
Mooncake). SGLang's decode engine cannot run a prompt alone, so an SGLang decode worker never
serves a request aggregated: it fails it with a clear error.

Without a GPU the same code runs against `dynamo_nb.engines.sglang_fake.RecordingSglangEngine`
(``fake=``), a stand-in with SGLang's method signatures that records what it is sent.

Example::

    server_args = sglang_server_args(args, tiny_model_path())       # SGLang's ServerArgs
    engine = await SglangEngine.start(server_args)                 # sglang.Engine, on a GPU
    request = PreprocessedRequest([5, 6], StopConditions(max_tokens=2), SamplingOptions(temperature=0))
    [output.token_ids async for output in engine.generate(request)]
    await engine.close()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..disagg.decode import bootstrap_of
from ..disagg.rooms import draw_room
from ..errors import DisaggregationError, EngineError, InvalidRequestError, RequestError
from ..llm.limits import RequestLimits
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.addresses import AddressRule, free_port
from ..runtime.context import Context
from ..runtime.streams import closing
from .base import KvEventSink, token_budget
from .kv_cache.zmq_relay import RelayedKvEvents, ZmqKvRelay
from .sglang_fake import SERVER_ARG_DEFAULTS, RecordingSglangEngine, StandInSettings

__all__ = [
    "SGLANG_VERSION",
    "SglangEngine",
    "sampling_params_of",
    "sglang_available",
    "sglang_server_args",
]

logger = logging.getLogger("dynamo_nb.engines.sglang")

SGLANG_VERSION = "0.5.23"
"""The SGLang release this engine is written and contract-tested against (the ``[sglang]`` extra pins it)."""

_FINISH = {"stop": "stop", "length": "length"}


def sglang_available() -> bool:
    """Whether SGLang's engine can be imported here (it needs CUDA and SGLang's dependencies)."""
    if importlib.util.find_spec("sglang") is None:
        return False
    try:
        import sglang.srt.entrypoints.engine  # noqa: F401
    except Exception:  # installed without its dependencies (API checks only), or no CUDA build
        return False
    return True


def sampling_params_of(request: PreprocessedRequest, max_new_tokens: int) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for ``request``: its sampling options and stop conditions.

    Example:
        >>> from dynamo_nb.llm import StopConditions, SamplingOptions
        >>> request = PreprocessedRequest([5], StopConditions(max_tokens=4), SamplingOptions(temperature=0, seed=3),
        ...                               eos_token_ids=[2])
        >>> sampling_params_of(request, 4)
        {'max_new_tokens': 4, 'min_new_tokens': 0, 'ignore_eos': False, 'temperature': 0, 'sampling_seed': 3, 'stop_token_ids': [2]}
    """
    stop = request.stop_conditions
    options = request.sampling_options
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": min(stop.min_tokens, max_new_tokens),
        "ignore_eos": stop.ignore_eos,
    }
    for name, value in (
        ("temperature", options.temperature),
        ("top_p", options.top_p),
        ("top_k", options.top_k),
    ):
        if value is not None:
            params[name] = value
    if options.seed is not None:
        params["sampling_seed"] = options.seed
    if request.eos_token_ids and not stop.ignore_eos:
        params["stop_token_ids"] = list(request.eos_token_ids)
    return params


def sglang_server_args(args: argparse.Namespace, model_path: str | Path) -> Any:
    """SGLang's ``ServerArgs`` from the SGLang worker's flags (`dynamo_nb.flags.sglang_worker_parser`),
    with ``model_path``, ``skip_tokenizer_init`` and ``incremental_streaming_output`` set; a plain
    namespace with the same fields where SGLang is not installed (the recording stand-in's)."""
    values = {**vars(args), "model_path": str(model_path), "skip_tokenizer_init": True}
    values["incremental_streaming_output"] = True
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception:  # not installed: the stand-in reads the same fields
        return argparse.Namespace(**{**SERVER_ARG_DEFAULTS, **values})
    return ServerArgs.from_cli_args(argparse.Namespace(**values))


def bootstrap_host_of(server_args: Any) -> str:
    """The host decode engines reach the prefill engine's bootstrap server at: the host of
    ``--dist-init-addr`` when set, else ``--host`` (loopback for a wildcard: give SGLang
    ``--host`` this host's address when decode engines run elsewhere)."""
    if server_args.dist_init_addr:
        return str(server_args.dist_init_addr).rsplit(":", 1)[0].strip("[]")
    return AddressRule().advertise(server_args.host, what=None)


def _kv_relay(server_args: Any) -> ZmqKvRelay | None:
    """The relay of SGLang's KV events, turning its ZMQ publisher on (``kv_events_config``)
    when the flags did not; None when it publishes somewhere other than ZMQ."""
    block_size = server_args.page_size or 1
    if not server_args.kv_events_config:
        # SGLang's publisher connects to an address without a wildcard: our relay binds it
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        server_args.kv_events_config = json.dumps(
            {"publisher": "zmq", "endpoint": endpoint, "topic": "kv-events"}
        )
        return ZmqKvRelay(endpoint, block_size, topic="kv-events", bind=True)
    config = json.loads(server_args.kv_events_config)
    if config.get("publisher", "null") != "zmq":
        logger.warning(
            "KV events: SGLang's publisher is %r, not zmq: no KV events are relayed, KV routers to this "
            "worker use their approximate mode",
            config.get("publisher"),
        )
        return None
    endpoint = config.get("endpoint", "tcp://*:5557")
    bind = "*" not in endpoint and not endpoint.startswith(("ipc://", "inproc://"))
    return ZmqKvRelay(
        endpoint.replace("*", "127.0.0.1"), block_size, topic=config.get("topic", ""), bind=bind
    )


class SglangEngine(RelayedKvEvents):
    """``sglang.Engine`` (or its recording stand-in) as an `Engine`, with SGLang's prefill and
    decode roles (see the module docstring).

    Attributes:
        llm: the ``sglang.Engine``.
        mode: ``aggregated``, ``prefill`` or ``decode`` (SGLang's ``--disaggregation-mode``).
        block_size: tokens per KV page (SGLang's ``page_size``; the model card publishes it).
        context_length: SGLang's context length for the model.
        relay: the KV-event relay (None: no sink was given).
    """

    max_num_seqs: int | None = None  # SGLang schedules and queues its requests itself
    kv_timeout: float = 30.0  # SGLang's own transfer waits for the KV with its own timeouts

    def __init__(self, llm: Any, relay: ZmqKvRelay | None = None) -> None:
        """Use `SglangEngine.start`."""
        manager = llm.tokenizer_manager
        server_args = manager.server_args
        self.llm = llm
        self.relay = relay
        self.server_args = server_args
        self.mode: str = {"null": "aggregated"}.get(
            server_args.disaggregation_mode, server_args.disaggregation_mode
        )
        self.block_size: int = server_args.page_size or 1
        self.context_length: int = manager.context_len
        self.vocab_size: int = manager.model_config.vocab_size
        self.incremental = bool(server_args.incremental_streaming_output)
        self.requests_total = 0
        self.aborted_total = 0
        self._aborted: set[str] = set()  # rids we asked SGLang to abort
        self._closed = False

    @classmethod
    async def start(
        cls, server_args: Any, *, kv_events: KvEventSink | None = None, fake: dict[str, Any] | None = None
    ) -> SglangEngine:
        """Start SGLang (``sglang.Engine(server_args=...)``, off the event loop) or, with ``fake``
        (`RecordingSglangEngine.launch` options), the recording stand-in; with ``kv_events`` its KV
        events go there."""
        relay = _kv_relay(server_args) if kv_events is not None else None
        if relay is not None and kv_events is not None:
            await relay.start(kv_events)  # before SGLang starts: no event is missed
        try:
            if fake is not None:
                llm = await RecordingSglangEngine.launch(server_args, **fake)
            else:
                import sglang

                llm = await asyncio.to_thread(lambda: sglang.Engine(server_args=server_args))
        except Exception as exc:
            if relay is not None:
                await relay.stop()
            raise EngineError(f"SGLang could not start: {exc}") from exc
        engine = cls(llm, relay)
        logger.info("SGLang %s started: %s", "stand-in" if fake is not None else "engine", engine)
        return engine

    @classmethod
    async def from_args(
        cls, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> SglangEngine:
        """The engine the SGLang worker's flags describe (SGLang's ``ServerArgs``, ``--model-path``;
        ``--fake-engine`` for the recording stand-in)."""
        fake = StandInSettings.from_args(args).launch_options()
        return await cls.start(sglang_server_args(args, model_path), kv_events=kv_events, fake=fake)

    @property
    def handoff_endpoint(self) -> dict[str, Any] | None:
        """A prefill engine's bootstrap server, ``{bootstrap_host, bootstrap_port}``: its worker
        publishes it as ``disaggregated_endpoint``, so routers take the fast path."""
        if self.mode != "prefill":
            return None
        return {
            "bootstrap_host": bootstrap_host_of(self.server_args),
            "bootstrap_port": int(self.server_args.disaggregation_bootstrap_port),
        }

    @property
    def active(self) -> int:
        """Requests SGLang holds now (its tokenizer manager's own table)."""
        return len(self.llm.tokenizer_manager.rid_to_state)

    # -- the Engine protocol

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """One output per SGLang item with new tokens; the last has ``finish_reason`` and usage.
        A decode engine cannot run a prompt alone: it raises `DisaggregationError`."""
        if self.mode != "aggregated":
            raise DisaggregationError(
                f"this SGLang engine runs with --disaggregation-mode {self.mode}: it cannot serve a request "
                "alone (a prefill worker must send it bootstrap info); start prefill workers, or an "
                "aggregated worker (--disaggregation-mode null)"
            )
        budget = token_budget(request, self.context_length)
        async with closing(self._run(request, budget, context)) as outputs:
            async for output in outputs:
                yield output

    def stats(self) -> dict[str, int]:
        """Requests SGLang holds now (``active``), KV events relayed, our request counts."""
        return {
            "active": self.active,
            "requests": self.requests_total,
            "aborted": self.aborted_total,
            "kv_events": self.kv_events_relayed,
        }

    async def close(self) -> None:
        """Stop relaying KV events and shut SGLang down."""
        if self._closed:
            return
        self._closed = True
        await self.stop_relay()
        if isinstance(self.llm, RecordingSglangEngine):
            self.llm.shutdown()
        else:
            await asyncio.to_thread(self.llm.shutdown)

    # -- disaggregated serving: SGLang's engines rendezvous on (host, port, room)

    async def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The prefill role: ``disaggregated_params`` {bootstrap_host, bootstrap_port,
        bootstrap_room} first (the router's room, else a new one; a host/port in
        ``bootstrap_info`` overrides this engine's), then SGLang's prefill with them."""
        endpoint = self.handoff_endpoint
        if endpoint is None:
            raise DisaggregationError(
                f"this SGLang engine runs with --disaggregation-mode {self.mode}, not prefill"
            )
        asked = request.bootstrap_info  # the router's room (and SGLang's server it named), else ours
        handoff = {
            "bootstrap_host": asked.host if asked is not None else endpoint["bootstrap_host"],
            "bootstrap_port": asked.port if asked is not None else endpoint["bootstrap_port"],
            "bootstrap_room": asked.room if asked is not None else draw_room(),
        }
        yield LLMEngineOutput([], disaggregated_params=handoff)
        budget = token_budget(request, self.context_length)
        async with closing(self._run(request, budget, context, handoff)) as outputs:
            async for output in outputs:
                yield output

    async def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode role: SGLang's decode with the prefill's (host, port, room), from
        ``bootstrap_info`` (fast path) or ``prefill_result.disaggregated_params`` (fallback)."""
        # SGLang's own bootstrap server takes (host, port, room): our room token is not its argument
        handoff = dataclasses.replace(bootstrap_of(request), token=None).to_dict()
        budget = token_budget(request, self.context_length)
        async with closing(self._run(request, budget, context, handoff)) as outputs:
            async for output in outputs:
                yield output

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0, advertise_host: str | None = None
    ) -> None:
        """SGLang's prefill engine runs its own bootstrap server (``--disaggregation-bootstrap-port``)."""
        return None

    # -- inside

    async def _run(
        self,
        request: PreprocessedRequest,
        max_new_tokens: int,
        context: Context | None,
        handoff: dict[str, Any] | None = None,
    ) -> AsyncIterator[LLMEngineOutput]:
        """Our outputs for SGLang's items; leaving early aborts the request inside SGLang."""
        if self._closed:
            raise EngineError("the SGLang engine is shut down")
        RequestLimits(vocab_size=self.vocab_size).check(request)
        rid = uuid.uuid4().hex
        prompt_tokens = len(request.token_ids)
        self.requests_total += 1
        stream: Any = None
        finished = False
        sent = 0
        # a stopped request is aborted inside SGLang at once, even while SGLang sends nothing
        # (a prefill running, a decode waiting for its KV)
        unwatch = context.add_stop_callback(lambda: self._abort(rid)) if context is not None else None
        try:
            stream = await self.llm.async_generate(
                input_ids=list(request.token_ids),
                sampling_params=sampling_params_of(request, max_new_tokens),
                stream=True,
                rid=rid,
                **(handoff or {}),
            )
            async for item in stream:
                ids = list(item.get("output_ids") or [])
                new = ids if self.incremental else ids[sent:]
                sent += len(new)
                meta = item.get("meta_info") or {}
                finish = meta.get("finish_reason")
                if finish is None and not (context is not None and context.is_stopped()):
                    if new:
                        yield LLMEngineOutput(new)
                    continue
                finished = True
                kind = finish.get("type") if isinstance(finish, dict) else finish
                if kind in _FINISH:
                    reason = _FINISH[kind]
                elif rid in self._aborted:  # we asked: the caller stopped
                    reason = "cancelled"
                else:
                    raise self._failure(finish, handoff)
                yield LLMEngineOutput.final(
                    new,
                    reason,
                    prompt_tokens=int(meta.get("prompt_tokens", prompt_tokens)),
                    completion_tokens=int(meta.get("completion_tokens", sent)),
                    cached_tokens=int(meta["cached_tokens"]) if "cached_tokens" in meta else None,
                )
                return
        except RequestError:
            raise
        except (ValueError, TypeError) as exc:  # SGLang's input checks (sampling, context, vocabulary)
            raise InvalidRequestError(f"SGLang refused the request: {exc}") from None
        except Exception as exc:
            raise EngineError(f"SGLang failed the request: {type(exc).__name__}: {exc}") from None
        finally:
            if unwatch is not None:
                unwatch()
            if not finished and stream is not None:
                self._abort(rid)  # SGLang's scheduler drops it
            self._aborted.discard(rid)
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    def _abort(self, rid: str) -> None:
        """Abort ``rid`` inside SGLang (once)."""
        if rid in self._aborted:
            return
        self._aborted.add(rid)
        self.aborted_total += 1
        self.llm.tokenizer_manager.abort_request(rid=rid)

    def _failure(self, finish: Any, handoff: dict[str, Any] | None) -> RequestError:
        """The error for an SGLang finish that is not stop or length (``abort`` with its message)."""
        message = finish.get("message") if isinstance(finish, dict) else None
        text = f"SGLang aborted the request: {message or finish}"
        if handoff is not None:
            room = handoff["bootstrap_room"]
            return DisaggregationError(f"{text} (bootstrap room {room})")
        status = finish.get("status_code") if isinstance(finish, dict) else None
        if status is not None and 400 <= int(status) < 500:
            return InvalidRequestError(text)
        return EngineError(text)

    def __repr__(self) -> str:
        return f"<SglangEngine mode={self.mode} page_size={self.block_size} context={self.context_length}>"
