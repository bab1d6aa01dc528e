"""`UpstreamEngine`: a running OpenAI-compatible server (``vllm serve``, SGLang's server, another
kit frontend) as an engine the kit serves, routes to and measures, the server left unchanged.

Tokens in and out, as every engine: the prompt goes as token ids (``/v1/completions`` with
``prompt`` a list of ids, which vLLM, SGLang's OpenAI server and the kit take) and vLLM's
``return_token_ids`` brings the generated ids back. A server that answers with text only has
its text encoded again by the model's tokenizer, said once in the log: its token boundaries may
differ from the server's (the text is the same; counts and stop-at-token may shift).

- A caller that stops (its context stopped, or the stream closed) closes the server's request:
  the connection is dropped, and the server stops generating.
- The server's 4xx answer (a prompt past its context, a bad parameter) is raised as an
  `InvalidRequestError` with the server's status and message, so the client gets the same
  error. A refused connection, a 5xx or a stream cut before its end is a
  `WorkerUnavailableError`: the caller takes this worker's instance as down and the frontend
  moves the request to another (migration), with the tokens already streamed.
- `connect` waits until the server lists its models (``GET /v1/models``) and takes the served
  name and the context length (vLLM's ``max_model_len``) from there.
- `watch` keeps a served instance in discovery only while the server answers: it leaves when the
  server stops answering and comes back (the same instance) when it answers again. At each
  check it also reads the server's own load from its Prometheus ``/metrics`` (`SERVER_LOAD`:
  vLLM's, SGLang's, the kit's names), which `stats` reports as ``server_running``,
  ``server_waiting``, ``server_kv_usage`` and ``server_kv_blocks`` (vLLM's cache size); the
  frontend's least-loaded and KV routers add it to their own count
  (`dynamo_nb.router.server_load`).
- With the server's ZMQ KV-event publisher (``--upstream-kv-events``: vLLM's
  ``--kv-events-config`` endpoint, SGLang's) its cache's events are relayed as the kit's
  (`dynamo_nb.engines.kv_cache.zmq_relay.ZmqKvRelay`), so ``--router-mode kv`` routes by what
  the server holds; its blocks are ``--kv-cache-block-size`` tokens (the server's block size).

Example::

    engine = await UpstreamEngine.connect("http://127.0.0.1:8000")      # a server that runs
    async for item in engine.generate(PreprocessedRequest(token_ids=[1, 450, 318])):
        print(item.token_ids)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    ConfigError,
    DisaggregationError,
    DynamoNBError,
    EngineError,
    InvalidRequestError,
    NotReadyError,
    WorkerUnavailableError,
)
from ..http.lean_client import HttpAnswer, LeanHttpClient, ServerAnswerError, fetch
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..llm.tokenizer import ModelTokenizer
from ..runtime.context import Context
from ..runtime.streams import closing
from ..settings import Settings, add_settings, at_least, greater_than, setting
from .base import EngineLimits, KvEventSink, token_budget
from .kv_cache.zmq_relay import RelayedKvEvents, ZmqKvRelay
from .vllm import kv_transfer_params_of

__all__ = ["UpstreamEngine", "UpstreamSettings"]

logger = logging.getLogger("dynamo_nb.engines.upstream")

_GROUP = "upstream server"

SERVER_LOAD = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "dynamo_frontend_inflight_requests"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "dynamo_frontend_queued_requests"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
}
"""The Prometheus series a server's load is read from, by what they say (the first a server has)."""
KV_BLOCKS_INFO = "vllm:cache_config_info"  # its num_gpu_blocks label: the cache's size (``kv_blocks``)


def server_load(metrics: str) -> dict[str, float]:
    """The load a server's ``/metrics`` text says (`SERVER_LOAD`; each series summed over its labels).

    Example:
        >>> server_load('vllm:num_requests_running{model_name="m"} 2.0')
        {'running': 2.0}
        >>> server_load('vllm:cache_config_info{block_size="16",num_gpu_blocks="512"} 1.0')
        {'kv_blocks': 512.0}
    """
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    blocks_label = ""  # the cache's size in blocks: a label of vLLM's cache_config_info
    try:
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                if sample.name.startswith(KV_BLOCKS_INFO):
                    blocks_label = sample.labels.get("num_gpu_blocks", "") or blocks_label
    except ValueError:  # not Prometheus text: no load known
        return {}
    load = {}
    for what, names in SERVER_LOAD.items():
        found = next((name for name in names if name in sums), None)
        if found is not None:
            load[what] = sums[found]
    if blocks_label:
        load["kv_blocks"] = float(blocks_label)
    return load


def _check_url(url: str | None) -> str | None:
    if url is None or url.startswith(("http://", "https://")):
        return None
    return "must be the server's base URL, http://HOST:PORT"


@dataclass(frozen=True)
class UpstreamSettings(Settings):
    """The upstream worker's own flags (see `dynamo_nb.settings`).

    Example:
        >>> UpstreamSettings(url="127.0.0.1:8000")
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: url (--upstream) must be the server's base URL, http://HOST:PORT, got '127.0.0.1:8000'
    """

    url: str | None = setting(
        None,
        flag="--upstream",
        env="UPSTREAM",
        group=_GROUP,
        check=_check_url,
        metavar="URL",
        default_text="none: required",
        help="the running OpenAI-compatible server to serve, http://HOST:PORT (vllm serve, SGLang's server …)",
    )
    model: str | None = setting(
        None,
        flag="--upstream-model",
        group=_GROUP,
        default_text="the first model the server lists",
        help="the model the server serves under this name",
    )
    api_key_env: str | None = setting(
        None,
        flag="--api-key-env",
        group=_GROUP,
        metavar="VAR",
        default_text="none",
        help="the environment variable holding the server's API key (sent as a bearer token)",
    )
    kv_events: str | None = setting(
        None,
        flag="--upstream-kv-events",
        group=_GROUP,
        metavar="ZMQ",
        default_text="none: no KV events",
        help="the server's ZMQ KV-event publisher to follow, tcp://HOST:PORT (vLLM's --kv-events-config "
        "endpoint), so --router-mode kv routes by what it holds; give --kv-cache-block-size its block size",
    )
    health_interval: float = setting(
        2.0,
        flag="--upstream-health-interval",
        group=_GROUP,
        check=at_least(0, "0 (off)"),
        help="seconds between checks that the server answers (GET /v1/models): while it does not, the "
        "worker leaves discovery, and comes back when it does",
    )
    ready_timeout: float = setting(
        120.0,
        flag="--upstream-ready-timeout",
        group=_GROUP,
        check=greater_than(0, "seconds"),
        help="seconds to wait at start for the server to list its models",
    )

    def _check(self) -> None:
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ConfigError(
                f"--api-key-env {self.api_key_env}: that variable is not set here; export it with the key"
            )


class UpstreamEngine(RelayedKvEvents):
    """A running OpenAI-compatible server as an engine (see the module docstring).

    Attributes:
        url: the server's base URL. model: the name it serves the model under.
        context_length: the server's (None: it did not say).
        active: requests in flight to it now. requests_total, refused_total, failed_total: sent,
            answered 4xx, failed (5xx or no answer).
    """

    max_num_seqs: int | None = None  # the server queues inside: no limit of its own here
    handoff_endpoint: dict[str, Any] | None = None  # prefill/decode: vLLM's connector moves the KV
    kv_timeout: float = 30.0  # a DisaggregatedEngine's; the server's own connector keeps its time

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        context_length: int | None = None,
        tokenizer: ModelTokenizer | None = None,
        relay: ZmqKvRelay | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.relay = relay
        # its blocks' size where its KV events are followed; else none of its own (the card has
        # the worker's --kv-cache-block-size)
        self.block_size: int | None = relay.block_size if relay is not None else None
        self.model = model
        self.context_length = context_length
        self.tokenizer = tokenizer
        self.active = 0
        self.requests_total = 0
        self.refused_total = 0
        self.failed_total = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.server_load: dict[str, float] = {}  # read at each `watch` check
        self.active_at_check = 0  # requests in flight through this engine when it was read
        self._client = LeanHttpClient(headers=self._headers or None)
        self._said_text_only = False

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        tokenizer: ModelTokenizer | None = None,
        timeout: float = 120.0,
        relay: ZmqKvRelay | None = None,
    ) -> UpstreamEngine:
        """The engine for the server at ``url``, once it lists its models (within ``timeout``
        seconds, else `NotReadyError` saying what was last seen); ``model``: the served name to
        use (default: the first listed; one not listed is a `ConfigError` naming those that are);
        ``relay``: its KV events' relay (started by the caller)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        listed = await _wait_for_models(url.rstrip("/"), headers, timeout)
        names = [str(entry.get("id")) for entry in listed]
        chosen = model or names[0]
        entry = next((entry for entry in listed if entry.get("id") == chosen), None)
        if entry is None:
            raise ConfigError(f"the server at {url} does not serve {chosen!r}; it serves {', '.join(names)}")
        context = entry.get("max_model_len") or entry.get("context_length") or entry.get("context_window")
        return cls(
            url,
            chosen,
            api_key=api_key,
            context_length=int(context) if isinstance(context, int) and context > 0 else None,
            tokenizer=tokenizer,
            relay=relay,
        )

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the flags `from_args` reads (`UpstreamSettings`' fields)."""
        add_settings(parser, UpstreamSettings)

    @classmethod
    async def from_args(
        cls, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> UpstreamEngine:
        """The engine the upstream worker's flags describe; ``model_path``'s tokenizer encodes
        the text of a server that returns no token ids; ``kv_events``: where the server's KV
        events go (with ``--upstream-kv-events``; or later, with `relay_events_to`)."""
        own = UpstreamSettings.from_args(args)
        if own.url is None:
            raise ConfigError("the upstream worker needs --upstream http://HOST:PORT (the server to serve)")
        api_key = os.environ[own.api_key_env] if own.api_key_env else None
        tokenizer = await asyncio.to_thread(ModelTokenizer.load, model_path)
        relay = None
        if own.kv_events is not None:
            relay = ZmqKvRelay(own.kv_events, EngineLimits.from_args(args).block_size)
        engine = await cls.connect(
            own.url,
            model=own.model,
            api_key=api_key,
            tokenizer=tokenizer,
            timeout=own.ready_timeout,
            relay=relay,
        )
        if kv_events is not None:
            await engine.relay_events_to(kv_events)
        return engine

    async def relay_events_to(self, kv_events: KvEventSink | None) -> UpstreamEngine:
        """Start relaying the server's KV events (``--upstream-kv-events``) to ``kv_events``, the
        sink `dynamo_nb.engines.engine_worker.serve_engine` hands its engine factory; the engine.

        Example::

            engine = await UpstreamEngine.from_args(args, model_path)   # the server's model name known
            await serve_engine(runtime, role, model_path, engine.model, engine.relay_events_to)
        """
        if self.relay is not None:
            if kv_events is None:
                logger.warning("--upstream-kv-events: this runtime has no event plane (give --nats-url)")
            else:
                await self.relay.start(kv_events)
        return self

    async def answers(self, timeout: float = 2.0) -> bool:
        """Whether the server answers ``GET /v1/models`` now (within ``timeout`` seconds)."""
        try:
            status, _ = await fetch(f"{self.url}/v1/models", headers=self._headers or None, timeout=timeout)
        except (ConnectionError, TimeoutError):
            return False
        return status == 200

    def watch(self, server: Any, interval: float = 2.0) -> asyncio.Task[None]:
        """A task that keeps ``server`` (the `dynamo_nb.EndpointServer` serving this engine) in
        discovery only while the server answers: every ``interval`` seconds it asks, and
        withdraws the instance when the server does not answer, rejoins when it does again.
        Cancel the task to stop watching.

        Example::

            watching = engine.watch(worker.server, interval=2.0)
        """
        return asyncio.get_running_loop().create_task(self._watch(server, interval), name="upstream-watch")

    async def read_load(self, timeout: float = 2.0) -> dict[str, float]:
        """The server's load now, from its ``/metrics`` ({} where it has none of `SERVER_LOAD`);
        ``active_at_check`` keeps how many of its requests came through this engine then: those
        in flight when the read began and those started during it (the server may count any of
        them, so one that ended meanwhile is counted as ours, not as someone else's)."""
        before, started_before = self.active, self.requests_total
        try:
            status, raw = await fetch(f"{self.url}/metrics", headers=self._headers or None, timeout=timeout)
        except (ConnectionError, TimeoutError):
            return {}
        self.server_load = server_load(raw.decode(errors="replace")) if status == 200 else {}
        self.active_at_check = before + (self.requests_total - started_before)
        return self.server_load

    async def _watch(self, server: Any, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            answering = await self.answers(timeout=max(interval, 1.0))
            if answering:
                await self.read_load(timeout=max(interval, 1.0))
            try:
                if not answering and not server.withdrawn:
                    logger.warning(
                        "the upstream server %s does not answer: instance %x leaves discovery until it does",
                        self.url, server.instance_id,
                    )  # fmt: skip
                    await server.withdraw()
                elif answering and server.withdrawn:
                    logger.warning("the upstream server %s answers again: instance %x is back", self.url,
                                   server.instance_id)  # fmt: skip
                    await server.rejoin()
            except Exception as exc:  # discovery unreachable now: the next check tries again
                logger.warning("could not change instance %x in discovery: %s", server.instance_id, exc)

    def request_body(self, request: PreprocessedRequest) -> dict[str, Any]:
        """The ``/v1/completions`` body for ``request``: its token ids as the prompt, its limits
        and sampling, streamed with usage and (vLLM's) the generated token ids.

        Example:
            >>> engine = UpstreamEngine("http://127.0.0.1:8000", "m")
            >>> body = engine.request_body(PreprocessedRequest(token_ids=[5, 6]))
            >>> body["prompt"], body["max_tokens"], body["return_token_ids"]
            ([5, 6], 16, True)
        """
        stop, sampling = request.stop_conditions, request.sampling_options
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.token_ids),
            "max_tokens": token_budget(request, None),
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if stop.min_tokens:
            body["min_tokens"] = stop.min_tokens
        if stop.ignore_eos:
            body["ignore_eos"] = True
        for name in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(sampling, name, None)
            if value is not None:
                body[name] = value
        return body

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The server's tokens as they come, then a last item with its finish reason and usage."""
        async with closing(self._stream(request, context, self.request_body(request))) as outputs:
            async for output in outputs:
                yield output

    # -- disaggregated serving over vLLM servers: their KV connector moves the prompt's blocks

    async def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The prefill role (the server started with a KV connector as producer,
        ``--kv-transfer-config``): the prompt with one output token and vLLM's
        ``kv_transfer_params {"do_remote_decode": true}``, as vLLM's own disaggregated proxy sends
        it; one item whose ``disaggregated_params`` carry the ``kv_transfer_params`` the server
        answered with, for the decode."""
        body = {
            **self.request_body(request),
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": REMOTE_DECODE,
        }
        body.pop("stream_options", None)
        body.pop("min_tokens", None)
        status, raw = await self._post(json.dumps(body).encode())
        if status >= 400:
            raise self._refusal(status, raw)
        answer = json.loads(raw)
        transfer = answer.get("kv_transfer_params")
        if not isinstance(transfer, dict):
            raise DisaggregationError(
                f"the upstream server {self.url} returned no kv_transfer_params for the prefill: start it with a KV "
                'connector as producer (--kv-transfer-config \'{"kv_connector": "NixlConnector", '
                '"kv_role": "kv_producer"}\'), see docs/upstream-servers.md'
            )
        choice = (answer.get("choices") or [{}])[0]
        ids = self._ids_of(choice)
        output = self._last(request, choice.get("finish_reason") or "length", answer.get("usage"), len(ids))
        output.token_ids = ids
        output.disaggregated_params = {"kv_transfer_params": transfer}
        yield output

    async def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode role (the server's KV connector as consumer): the request with the prefill's
        ``kv_transfer_params``, so the server pulls the prompt's KV instead of computing it."""
        body = {**self.request_body(request), "kv_transfer_params": kv_transfer_params_of(request)}
        async with closing(self._stream(request, context, body)) as outputs:
            async for output in outputs:
                yield output

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0, advertise_host: str | None = None
    ) -> None:
        """No bootstrap server of ours: the server's KV connector has its own side channel, and
        the frontend takes the fallback path (it waits for the prefill's ``kv_transfer_params``)."""
        return None

    async def _open(self, body: bytes) -> HttpAnswer:
        """POST ``body`` to the server's ``/v1/completions``: its answer, or `WorkerUnavailableError`."""
        try:
            return await self._client.request(
                "POST", f"{self.url}/v1/completions", body, {"Content-Type": "application/json"}
            )
        except ServerAnswerError as exc:
            self.failed_total += 1
            raise WorkerUnavailableError(f"the upstream server {self.url} did not answer: {exc}") from None

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        """`_open`, counted as a request, and its whole answer: status and body."""
        self.requests_total += 1
        self.active += 1
        try:
            answer = await self._open(body)
            try:
                return answer.status, await answer.read()
            except ServerAnswerError as exc:
                self.failed_total += 1
                raise WorkerUnavailableError(
                    f"the upstream server {self.url} did not answer: {exc}"
                ) from None
            finally:
                answer.close()
        finally:
            self.active -= 1

    async def _stream(
        self, request: PreprocessedRequest, context: Context | None, request_body: dict[str, Any]
    ) -> AsyncIterator[LLMEngineOutput]:
        self.requests_total += 1
        self.active += 1
        answer: HttpAnswer | None = None
        body = json.dumps(request_body).encode()
        try:
            answer = await self._open(body)
            if answer.status >= 400:
                raise self._refusal(answer.status, await answer.read())
            emitted, finish, usage, done = 0, None, None, False
            lines = answer.lines()
            while True:
                try:
                    line = await anext(lines)
                except StopAsyncIteration:
                    break
                except ServerAnswerError as exc:  # the server went away mid-stream
                    self.failed_total += 1
                    raise WorkerUnavailableError(
                        f"the upstream server {self.url} cut the stream after {emitted} tokens: {exc}"
                    ) from None
                if context is not None and context.is_stopped():
                    yield LLMEngineOutput.final(
                        [], "cancelled", prompt_tokens=len(request.token_ids), completion_tokens=emitted
                    )
                    return
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    self.failed_total += 1
                    raise WorkerUnavailableError(
                        f"the upstream server {self.url} failed mid-stream: {_message(event)}"
                    )
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    ids = self._ids_of(choice)
                    finish = choice.get("finish_reason") or finish
                    if ids:
                        emitted += len(ids)
                        yield LLMEngineOutput(ids)
            if not done and finish is None:
                self.failed_total += 1
                raise WorkerUnavailableError(
                    f"the upstream server {self.url} ended the stream after {emitted} tokens without its end"
                )
            yield self._last(request, finish, usage, emitted)
        finally:
            self.active -= 1
            if answer is not None:
                answer.close()  # a request left early: the server sees the connection drop

    def _ids_of(self, choice: dict[str, Any]) -> list[int]:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            return [int(token) for token in ids]
        text = choice.get("text") or ""
        if not text:
            return []
        if self.tokenizer is None:
            raise EngineError(
                f"the upstream server {self.url} returns text without token ids (no return_token_ids) and "
                "this engine has no tokenizer to encode it: give it the model's folder (--model-path)"
            )
        if not self._said_text_only:
            self._said_text_only = True
            logger.warning(
                "the upstream server %s returns no token ids: its text is encoded again here, so token "
                "counts may differ from the server's",
                self.url,
            )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _last(
        self, request: PreprocessedRequest, finish: str | None, usage: dict[str, Any] | None, emitted: int
    ) -> LLMEngineOutput:
        usage = usage or {}
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        completion = usage.get("completion_tokens")
        return LLMEngineOutput.final(
            [],
            finish or "stop",
            prompt_tokens=len(request.token_ids),
            completion_tokens=completion if isinstance(completion, int) else emitted,
            cached_tokens=cached if isinstance(cached, int) else None,
        )

    def _refusal(self, status: int, raw: bytes) -> DynamoNBError:
        """The server's error answer as ours: a 4xx keeps its status and message."""
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"message": raw.decode(errors="replace")[:300]}
        message = _message(data)
        if 400 <= status < 500:
            self.refused_total += 1
            error = InvalidRequestError(message, param=_param(data))
            error.http_status = status  # type: ignore[misc]  # the server's own answer, per request
            return error
        self.failed_total += 1
        return WorkerUnavailableError(f"the upstream server {self.url} answered {status}: {message}")

    def stats(self) -> dict[str, Any]:
        """Requests sent, refused (4xx) and failed, in flight now, KV events relayed, the server's
        URL and its own load as its ``/metrics`` said at the last check (``server_running`` …;
        a series it does not have yet, such as one labelled by a model not asked for, is absent),
        and how many requests this engine had in flight then (``active_at_check``)."""
        return {
            "requests": self.requests_total,
            "refused": self.refused_total,
            "failed": self.failed_total,
            "active": self.active,
            "kv_events_relayed": self.kv_events_relayed,
            "server_url": self.url,  # a server's figures follow (none yet: it runs nothing known)
            **{f"server_{what}": value for what, value in self.server_load.items()},
            "active_at_check": self.active_at_check,  # of those figures, what came through this engine
        }

    async def close(self) -> None:
        """Close the connections to the server (the server keeps running) and stop relaying."""
        await self.stop_relay()
        await self._client.close()

    def __repr__(self) -> str:
        return f"<UpstreamEngine {self.model} at {self.url}, {self.active} active>"


REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
"""A prefill request's ``kv_transfer_params``: vLLM's disaggregated proxy sends these."""


def _message(data: dict[str, Any]) -> str:
    error = data.get("error", data)
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _param(data: dict[str, Any]) -> str | None:
    error = data.get("error", data)
    param = error.get("param") if isinstance(error, dict) else None
    return param if isinstance(param, str) else None


async def _wait_for_models(url: str, headers: dict[str, str] | None, timeout: float) -> list[dict[str, Any]]:
    """The server's ``GET /v1/models`` list, once it answers with at least one model."""
    deadline = time.monotonic() + timeout
    seen = "no answer"
    while True:
        try:
            status, raw = await fetch(f"{url}/v1/models", headers=headers, timeout=5.0)
            listed = (
                [e for e in json.loads(raw).get("data", []) if isinstance(e, dict)] if status == 200 else []
            )
        except (ConnectionError, TimeoutError, ValueError) as exc:
            status, listed, seen = 0, [], f"{type(exc).__name__}: {exc}"
        if listed:
            return listed
        if status in (401, 403):
            raise ConfigError(
                f"the server at {url} answered {status} to GET /v1/models: give its API key (--api-key-env VAR)"
            )
        if status:
            seen = "no model listed yet" if status == 200 else f"status {status}"
        if time.monotonic() >= deadline:
            raise NotReadyError(
                f"the upstream server {url} did not list a model within {timeout:g} s (last: {seen}): start it "
                "first, or check --upstream"
            )
        await asyncio.sleep(0.25)
