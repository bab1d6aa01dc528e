"""A recording stand-in for ``sglang.Engine``, for machines without a GPU (SGLang needs CUDA).

`RecordingSglangEngine` has the parts of SGLang's API that `dynamo_nb.engines.sglang` uses,
with SGLang's names, keyword defaults and output shapes (SGLang 0.5.23; the contract test
checks them against SGLang's source): ``async_generate(input_ids=, sampling_params=,
stream=True, bootstrap_host=, bootstrap_port=, bootstrap_room=, rid=)`` returning an async
iterator of ``{"output_ids", "meta_info"}`` dicts, ``tokenizer_manager.abort_request(rid=)``,
``tokenizer_manager.rid_to_state``, ``server_args`` and ``shutdown()``. It checks what it is
sent the way SGLang does (sampling parameters by name and range, token ids in the vocabulary,
the prompt within the context, bootstrap host/port/room in the prefill and decode modes) and
records every call, in memory (``calls``) and, with ``record_path``, as JSON lines.

Its "model" is a deterministic function of the prompt: greedy tokens hash the prompt and
position, a ``sampling_seed`` picks a repeatable sample. Disaggregated modes behave like
SGLang's: the prefill engine (``disaggregation_mode="prefill"``) runs a bootstrap server on
``disaggregation_bootstrap_port`` and parks the prompt's "KV" (its first token) under the
request's room; the decode engine fetches it from ``bootstrap_host:bootstrap_port`` by room and
goes on from it, so a wrong room or host fails there, as it would on SGLang. With
``kv_events_config`` it publishes KV events in SGLang's ZMQ format.

Example::

    fake = await RecordingSglangEngine.launch(argparse.Namespace(model_path=str(tiny_model_path())))
    stream = await fake.async_generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 2}, stream=True)
    [item["output_ids"] async for item in stream]          # two deltas, e.g. [[283], [90]]
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..disagg.bootstrap import BootstrapServer, fetch_kv
from ..disagg.rooms import BootstrapInfo
from ..settings import Settings, at_least, setting

__all__ = ["SAMPLING_PARAM_NAMES", "RecordingSglangEngine", "StandInSettings"]

logger = logging.getLogger("dynamo_nb.engines.sglang_fake")

SAMPLING_PARAM_NAMES = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "stop_token_ids",
        "ignore_eos",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "sampling_seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "n",
    }
)
"""The fields of SGLang's ``SamplingParams`` this stand-in understands (each one is SGLang's)."""

SERVER_ARG_DEFAULTS: dict[str, Any] = {
    "model_path": None,
    "host": "127.0.0.1",
    "disaggregation_mode": "null",
    "disaggregation_bootstrap_port": 8998,
    "disaggregation_transfer_backend": "mooncake",
    "page_size": None,
    "context_length": None,
    "kv_events_config": None,
    "skip_tokenizer_init": False,
    "incremental_streaming_output": False,
    "dist_init_addr": None,
    "tp_size": 1,
}
"""SGLang's ``ServerArgs`` fields the stand-in reads, with SGLang's defaults."""

_STAND_IN = "recording stand-in for SGLang (hosts without a GPU)"


@dataclass(frozen=True)
class StandInSettings(Settings):
    """The SGLang worker's ``--fake-*`` flags: whether it serves with the recording stand-in
    instead of ``sglang.Engine`` (SGLang needs CUDA), and how the stand-in behaves.

    Example:
        >>> StandInSettings(fake_engine=True, fake_prefill_delay=0.5).launch_options()
        {'record_path': None, 'prefill_delay': 0.5, 'fail_prefill': False}
        >>> StandInSettings().launch_options() is None
        True
    """

    fake_engine: bool = setting(
        False,
        flag="--fake-engine",
        group=_STAND_IN,
        default_text="off",
        help="serve with a stand-in that has SGLang's method signatures and records every call, not "
        "sglang.Engine (SGLang needs CUDA); its tokens are a function of the prompt",
    )
    fake_record: str | None = setting(
        None,
        flag="--fake-record",
        group=_STAND_IN,
        default_text="none",
        help="stand-in: append each call to this JSON-lines file",
    )
    fake_prefill_delay: float = setting(
        0.0,
        flag="--fake-prefill-delay",
        group=_STAND_IN,
        check=at_least(0),
        help="stand-in: seconds each prefill takes",
    )
    fake_fail_prefill: bool = setting(
        False,
        flag="--fake-fail-prefill",
        group=_STAND_IN,
        default_text="off",
        help="stand-in: fail every prefill as a lost KV transfer does",
    )

    def launch_options(self) -> dict[str, Any] | None:
        """`RecordingSglangEngine.launch`'s options, or None to start SGLang itself."""
        if not self.fake_engine:
            return None
        return {
            "record_path": self.fake_record,
            "prefill_delay": self.fake_prefill_delay,
            "fail_prefill": self.fake_fail_prefill,
        }


@dataclass
class _ReqState:
    """One request held, as SGLang's tokenizer manager holds it (``rid_to_state``)."""

    rid: str
    aborted: bool = False
    finished: bool = False
    abort_event: asyncio.Event = field(default_factory=asyncio.Event)

    def abort(self) -> None:
        self.aborted = True
        self.abort_event.set()


@dataclass
class _FakeTokenizerManager:
    """What ``sglang.Engine.tokenizer_manager`` offers the worker: ``server_args``, ``context_len``,
    ``model_config.vocab_size``, ``rid_to_state`` and ``abort_request``."""

    server_args: Any
    context_len: int
    model_config: Any
    record: Any
    rid_to_state: dict[str, _ReqState] = field(default_factory=dict)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """SGLang's signature: abort ``rid`` (or every request); the stream ends with finish ``abort``."""
        self.record({"call": "abort_request", "rid": rid, "abort_all": abort_all})
        for state in list(self.rid_to_state.values()):
            if abort_all or state.rid == rid:
                state.abort()


@dataclass(frozen=True)
class _ModelConfig:
    vocab_size: int


class RecordingSglangEngine:
    """The stand-in (see the module docstring); build it with `launch`.

    Attributes:
        server_args: the ``ServerArgs`` (or any object with its fields) it was launched with.
        tokenizer_manager: ``server_args``, ``context_len``, ``model_config``, ``rid_to_state``,
            ``abort_request`` (SGLang's names).
        calls: every call, in order (``{"call": "async_generate", ...}``, ``{"call": "abort_request", ...}``).
        token_interval: seconds between streamed tokens; ``prefill_delay``: seconds a prefill takes.
        fail_prefill: when set, every prefill fails as a lost transfer does on SGLang (finish ``abort``).
    """

    def __init__(
        self,
        server_args: Any,
        *,
        vocab_size: int,
        context_length: int,
        record_path: str | Path | None = None,
        token_interval: float = 0.002,
        prefill_delay: float = 0.0,
        fail_prefill: bool = False,
    ) -> None:
        """Use `launch`."""
        self.server_args = server_args
        self.calls: list[dict[str, Any]] = []
        self.record_path = Path(record_path) if record_path else None
        self.token_interval = token_interval
        self.prefill_delay = prefill_delay
        self.fail_prefill = fail_prefill
        self.tokenizer_manager = _FakeTokenizerManager(
            server_args, context_length, _ModelConfig(vocab_size), self._record
        )
        self.bootstrap: BootstrapServer | None = None
        self._publisher: Any = None
        self._event_seq = 0
        self._stored: set[int] = set()

    @classmethod
    async def launch(
        cls,
        server_args: Any,
        *,
        record_path: str | Path | None = None,
        token_interval: float = 0.002,
        prefill_delay: float = 0.0,
        fail_prefill: bool = False,
    ) -> RecordingSglangEngine:
        """Start it as SGLang starts: the model's config read from ``model_path``; in the prefill
        mode its bootstrap server on ``host:disaggregation_bootstrap_port``; with
        ``kv_events_config`` its ZMQ publisher."""
        for name, default in SERVER_ARG_DEFAULTS.items():
            if not hasattr(server_args, name):
                setattr(server_args, name, default)
        config = json.loads((Path(server_args.model_path) / "config.json").read_text())
        context = server_args.context_length or config.get("max_position_embeddings", 2048)
        fake = cls(
            server_args,
            vocab_size=int(config["vocab_size"]),
            context_length=int(context),
            record_path=record_path,
            token_interval=token_interval,
            prefill_delay=prefill_delay,
            fail_prefill=fail_prefill,
        )
        if server_args.disaggregation_mode == "prefill":
            fake.bootstrap = await BootstrapServer.start(
                server_args.host, server_args.disaggregation_bootstrap_port, ttl=60.0
            )
        if server_args.kv_events_config:
            fake._start_publisher(json.loads(server_args.kv_events_config))
            await asyncio.sleep(0.3)  # ZMQ's slow joiner: the subscriber's filter must reach the publisher
        return fake

    # -- SGLang's API

    async def async_generate(
        self,
        *,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        stream: bool = False,
        bootstrap_host: str | None = None,
        bootstrap_port: int | None = None,
        bootstrap_room: int | None = None,
        rid: str | None = None,
    ) -> Any:
        """SGLang's ``Engine.async_generate`` (the keywords the worker uses): an async iterator of
        outputs with ``stream=True``, else the final output. Raises ``ValueError`` where SGLang does."""
        mode = self.server_args.disaggregation_mode
        self._record(
            {
                "call": "async_generate",
                "mode": mode,
                "rid": rid,
                "prompt_tokens": len(input_ids or []),
                "sampling_params": sampling_params,
                "stream": stream,
                "bootstrap_host": bootstrap_host,
                "bootstrap_port": bootstrap_port,
                "bootstrap_room": bootstrap_room,
            }
        )
        if prompt is not None or input_ids is None:
            raise ValueError("skip_tokenizer_init is set: send input_ids, not a prompt")
        params = self._checked(sampling_params or {}, input_ids)
        if mode in ("prefill", "decode") and None in (bootstrap_host, bootstrap_port, bootstrap_room):
            raise ValueError(
                f"a request to a {mode} engine needs bootstrap_host, bootstrap_port and bootstrap_room"
            )
        rid = rid or f"fake-{len(self.calls)}"
        state = _ReqState(rid)
        self.tokenizer_manager.rid_to_state[rid] = state
        if mode in ("prefill", "decode"):
            # (checked above: none of the three is None)
            info = BootstrapInfo(
                cast(str, bootstrap_host), cast(int, bootstrap_port), cast(int, bootstrap_room)
            )
            role = self._prefill if mode == "prefill" else self._decode
            outputs = role(input_ids, params, state, info)
        else:
            outputs = self._generate(input_ids, params, state, first=None)
        if stream:
            return outputs
        items = [item async for item in outputs]
        return items[-1] if items else None

    def shutdown(self) -> None:
        """SGLang's ``Engine.shutdown``: stop serving (the bootstrap server and publisher go too)."""
        self._record({"call": "shutdown"})
        if self.bootstrap is not None:
            server, self.bootstrap = self.bootstrap, None
            try:
                asyncio.get_running_loop().create_task(server.stop())
            except RuntimeError:
                pass
        if self._publisher is not None:
            self._publisher.close(linger=0)
            self._publisher = None

    # -- inside

    def _record(self, entry: dict[str, Any]) -> None:
        entry = {"t": round(time.time(), 6), **entry}
        self.calls.append(entry)
        if self.record_path is not None:
            with self.record_path.open("a") as out:
                out.write(json.dumps(entry) + "\n")

    def _checked(self, params: dict[str, Any], input_ids: list[int]) -> dict[str, Any]:
        """SGLang's checks, in its words: unknown parameters, ranges, vocabulary, context."""
        unknown = sorted(set(params) - SAMPLING_PARAM_NAMES)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        temperature = params.get("temperature", 1.0)
        top_p, top_k = params.get("top_p", 1.0), params.get("top_k", -1)
        if temperature < 0:
            raise ValueError(f"temperature must be a non-negative finite number, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
        if top_k < 1 and top_k != -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        vocab = self.tokenizer_manager.model_config.vocab_size
        for token_id in input_ids:
            if not 0 <= token_id < vocab:
                raise ValueError(
                    f"The input_ids contains an out-of-vocabulary token id {token_id}; valid range is [0, {vocab})."
                )
        context = self.tokenizer_manager.context_len
        if len(input_ids) >= context:
            raise ValueError(
                f"The input ({len(input_ids)} tokens) is longer than the model's context length ({context} tokens)."
            )
        return params

    def _release(self, state: _ReqState) -> None:
        """The request is done: SGLang's tokenizer manager forgets it."""
        state.finished = True
        self.tokenizer_manager.rid_to_state.pop(state.rid, None)

    def _token(self, input_ids: list[int], position: int, rng: random.Random | None) -> int:
        vocab = self.tokenizer_manager.model_config.vocab_size
        if rng is not None:
            return rng.randrange(3, vocab)
        digest = zlib.crc32(json.dumps(input_ids).encode())
        return 3 + (digest + 7919 * (position + 1)) % (vocab - 3)

    def _rng(self, input_ids: list[int], params: dict[str, Any]) -> random.Random | None:
        if params.get("temperature", 1.0) == 0 or params.get("top_k") == 1:
            return None
        seed = params.get("sampling_seed")
        return random.Random(f"{seed}:{input_ids}") if seed is not None else random.Random()

    def _output(
        self, state: _ReqState, ids: list[int], finish: dict[str, Any] | None, prompt: int, done: int
    ) -> dict[str, Any]:
        meta = {
            "id": state.rid,
            "finish_reason": finish,
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "cached_tokens": 0,
        }
        return {"output_ids": ids, "meta_info": meta}

    async def _generate(
        self, input_ids: list[int], params: dict[str, Any], state: _ReqState, *, first: int | None
    ) -> AsyncIterator[dict[str, Any]]:
        """Tokens one per step, as deltas with ``incremental_streaming_output``, else cumulative."""
        incremental = bool(self.server_args.incremental_streaming_output)
        budget = params.get("max_new_tokens", 128)
        least = params.get("min_new_tokens", 0)
        stops = set(params.get("stop_token_ids") or ()) if not params.get("ignore_eos") else set()
        rng = self._rng(input_ids, params)
        out: list[int] = []
        try:
            self._publish_stored(input_ids)
            for position in range(budget):
                await asyncio.sleep(self.token_interval)
                if state.aborted:
                    yield self._output(
                        state, [], {"type": "abort", "message": "Abort request"}, len(input_ids), len(out)
                    )
                    return
                token = self._token(input_ids, position, rng)  # a sample is drawn either way
                if position == 0 and first is not None:
                    token = first  # the decode engine goes on from the prefill's token
                out.append(token)
                finish = None
                if token in stops and len(out) > least:
                    finish = {"type": "stop", "matched": token}
                elif len(out) == budget:
                    finish = {"type": "length", "length": budget}
                yield self._output(
                    state, [token] if incremental else list(out), finish, len(input_ids), len(out)
                )
                if finish is not None:
                    return
        finally:
            self._release(state)

    async def _prefill(
        self, input_ids: list[int], params: dict[str, Any], state: _ReqState, info: BootstrapInfo
    ) -> AsyncIterator[dict[str, Any]]:
        """The prefill engine: the prompt's first token, its "KV" parked under the room."""
        try:
            if self.bootstrap is None or info.port != self.bootstrap.endpoint["bootstrap_port"]:
                raise ValueError(f"bootstrap_port {info.port} is not this prefill engine's bootstrap server")
            await asyncio.sleep(self.prefill_delay)
            if state.aborted or self.fail_prefill:
                why = "Abort request" if state.aborted else "KV transfer to the decode engine failed"
                self.bootstrap.fail(info.room, why)
                yield self._output(state, [], {"type": "abort", "message": why}, len(input_ids), 0)
                return
            self._publish_stored(input_ids)
            first = self._token(input_ids, 0, self._rng(input_ids, params))
            self.bootstrap.park(
                info.room, {"first_token": first, "prompt_tokens": len(input_ids), "payload_bytes": 0}, b""
            )
            yield self._output(state, [first], {"type": "length", "length": 1}, len(input_ids), 1)
        finally:
            self._release(state)

    async def _decode(
        self, input_ids: list[int], params: dict[str, Any], state: _ReqState, info: BootstrapInfo
    ) -> AsyncIterator[dict[str, Any]]:
        """The decode engine: the prompt's "KV" fetched by room, then the tokens after it."""
        fetch = asyncio.ensure_future(fetch_kv(info, timeout=30.0))
        aborted = asyncio.ensure_future(state.abort_event.wait())
        try:
            await asyncio.wait({fetch, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if state.aborted:  # SGLang's decode drops a request aborted while it waits for the KV
                self._release(state)
                yield self._output(
                    state, [], {"type": "abort", "message": "Abort request"}, len(input_ids), 0
                )
                return
            header, _ = fetch.result()
        except Exception as exc:
            self._release(state)
            message = f"KV transfer from {info.host}:{info.port} room {info.room} failed: {exc}"
            yield self._output(state, [], {"type": "abort", "message": message}, len(input_ids), 0)
            return
        finally:
            for task in (fetch, aborted):
                task.cancel()
        if header.get("prompt_tokens") != len(input_ids):
            self._release(state)
            message = f"room {info.room} holds the KV of another prompt"
            yield self._output(state, [], {"type": "abort", "message": message}, len(input_ids), 0)
            return
        async for item in self._generate(input_ids, params, state, first=header["first_token"]):
            yield item

    def _start_publisher(self, config: dict[str, Any]) -> None:
        """SGLang's ZMQ publisher: connects to a named host, binds a wildcard one."""
        import zmq

        endpoint = config.get("endpoint", "tcp://*:5557")
        self._topic = config.get("topic", "").encode()
        self._publisher = zmq.Context.instance().socket(zmq.PUB)
        if "*" in endpoint:
            self._publisher.bind(endpoint)
        else:
            self._publisher.connect(endpoint)

    def _publish_stored(self, input_ids: list[int]) -> None:
        """``BlockStored`` for the prompt's full pages not stored before, in SGLang's format."""
        if self._publisher is None:
            return
        import msgpack

        page = self.server_args.page_size or 1
        events, parent = [], None
        for end in range(page, len(input_ids) + 1, page):
            block = zlib.crc32(json.dumps(input_ids[:end]).encode())
            if block not in self._stored:
                self._stored.add(block)
                events.append(
                    {
                        "type": "BlockStored",
                        "block_hashes": [block],
                        "parent_block_hash": parent,
                        "token_ids": input_ids[end - page : end],
                        "block_size": page,
                        "lora_id": None,
                    }
                )
            parent = block
        if events:
            self._event_seq += 1
            batch = msgpack.packb([time.time(), events, None])
            self._publisher.send_multipart([self._topic, self._event_seq.to_bytes(8, "big"), batch])
