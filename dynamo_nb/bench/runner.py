"""`run`: a load sweep, closed-loop over concurrency levels or open-loop over request rates, one record per request."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

import pandas as pd

from ..errors import ConfigError, NoInstancesError
from ..http.lean_client import LeanHttpClient, fetch
from .http_client import RECORD_COLUMNS, send_request
from .progress import progress_bar
from .prompts import Prompt, as_prompts
from .records import records_frame

if TYPE_CHECKING:
    from .live import LiveChart

__all__ = ["ENDPOINTS", "run", "wait_for_model"]

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _instances_serving(health: Any, model: str, names: list[str]) -> int:
    """How many instances ``/health`` shows serving ``model``: ours names each instance's model;
    Dynamo's names none, so there the distinct instances of ``generate`` endpoints count."""
    listed = health.get("instances", []) if isinstance(health, dict) else []
    entries = [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []
    if any("model" in entry for entry in entries) or not entries:
        return sum(1 for entry in entries if entry.get("model") == model)
    if len(names) > 1:
        raise ConfigError(
            f"this frontend's /health does not say which model an instance serves (Dynamo's) and it lists "
            f"{len(names)} models: wait with instances=0, or count the workers of {model!r} yourself"
        )
    return len({entry.get("instance_id") for entry in entries if entry.get("endpoint") == "generate"})


def _base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"url must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _rates(rate: float | Iterable[float]) -> list[float]:
    rates = [rate] if isinstance(rate, (int, float)) else list(rate)
    if not rates or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates):
        raise ConfigError(f"rate must be a positive number of requests/s (or a list of them), got {rate!r}")
    return [float(r) for r in rates]


def _levels(concurrency: int | Iterable[int]) -> list[int]:
    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not levels or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in levels):
        raise ConfigError(f"concurrency must be a positive integer or a list of them, got {concurrency!r}")
    return levels


def _payloads(
    prompts: Sequence[Prompt],
    model: str,
    endpoint: str,
    stream: bool,
    max_tokens: int,
    options: Mapping[str, Any],
) -> list[bytes]:
    """One request body per prompt, encoded once (the hot loop only sends bytes)."""
    bodies = []
    for prompt in prompts:
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
        if endpoint == "chat":
            body["messages"] = list(prompt.messages)
        else:
            body["prompt"] = prompt.text
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(options)
        bodies.append(json.dumps(body).encode())
    return bodies


async def run(
    url: str,
    model: str,
    *,
    prompts: Iterable[Prompt | str | Sequence[dict[str, str]]] | None = None,
    concurrency: int | Iterable[int] = (1, 8, 32),
    rate: float | Iterable[float] | None = None,
    requests: int | None = None,
    max_tokens: int = 64,
    stream: bool = True,
    endpoint: str = "chat",
    label: str = "",
    temperature: float | None = None,
    ignore_eos: bool = False,
    worker_ids: bool = True,
    extra_body: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    timeout: float = 300.0,
    warmup: int = 0,
    new_connection: bool = False,
    progress: bool = True,
    live: LiveChart | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Drive ``url`` at each concurrency level (or request rate) in turn; one row per request.

    At level ``c``, ``c`` clients each send their next request as soon as the previous one
    ends (closed loop) until ``requests`` have been sent. With ``rate``, requests arrive
    open-loop instead, at each rate in turn: Poisson arrivals (exponential gaps drawn from
    ``seed``) whatever the server's pace, as ``vllm bench serve --request-rate`` and aiperf
    send them; the ``rate`` column holds the offered rate. Prompt ``i % len(prompts)`` goes
    with request ``i``, so every level sees the same prompts.

    Args:
        url: the server's base URL (``http://host:port``, with or without ``/v1``): ours,
            vLLM's, SGLang's, Dynamo's or any OpenAI-compatible one.
        model: the model name to ask for.
        prompts: `Prompt` objects, strings or message lists (default: 100 random prompts).
        concurrency: the levels to run, in order.
        rate: request rates (requests/s) to run open-loop, in order, instead of concurrency
            levels (see `slo` for goodput and the highest rate within an SLO).
        requests: requests per level (default: 4 × the level, at least 16; per rate: 4 s of
            arrivals, at least 16).
        max_tokens: the ``max_tokens`` of each request.
        stream: SSE streaming (TTFT and gaps per token) or one JSON answer (TTFT = e2e).
        endpoint: ``"chat"`` or ``"completions"``.
        label: a value for the ``label`` column (to compare runs: router modes, servers…).
        temperature: sent when given.
        ignore_eos: ask the server to always produce ``max_tokens`` (vLLM, SGLang, ours).
        worker_ids: ask for ``nvext.extra_fields = ["worker_id"]`` (Dynamo, ours) to learn
            which worker served each request; turn off for servers that reject unknown fields.
        extra_body: more request fields, merged last.
        api_key: sent as ``Authorization: Bearer …``.
        timeout: seconds one request may take; it then counts as an error.
        warmup: requests sent (and not recorded) before the first level.
        new_connection: open a new TCP connection for every request (connect time counts in
            TTFT, as for clients that do not keep connections alive); default keep-alive.
        progress: a progress bar (a widget in a notebook, tqdm on a terminal).
        live: a `LiveChart` (see `live`) redrawn while the run goes.
        seed: the seed of the arrival times of a rate sweep.

    Returns:
        A DataFrame with the columns of `RECORD_COLUMNS`: ``label``, ``concurrency`` (None in a
        rate sweep), ``rate`` (None in a concurrency sweep), ``index``, ``prompt``, ``sent_s``, ``ttft_s``, ``e2e_s``, ``itl_s`` (the list of
        inter-token gaps), ``output_tokens``, ``input_tokens``, ``status``, ``error``,
        ``worker``, ``prefill_worker``, ``path``. Times are seconds. Failed requests are
        rows with ``error`` set; nothing raises for a server error.

    Example::

        df = await bench.run("http://127.0.0.1:8000", "tiny-llama", concurrency=[1, 8])
        bench.summary(df)
    """
    base = _base_url(url)
    if endpoint not in ENDPOINTS:
        raise ConfigError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if requests is not None and (not isinstance(requests, int) or requests < 1):
        raise ConfigError(f"requests must be a positive integer, got {requests!r}")
    rates = _rates(rate) if rate is not None else None
    levels = _levels(concurrency) if rates is None else rates
    prompt_list = as_prompts(prompts)
    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if ignore_eos:
        options["ignore_eos"] = True
    if worker_ids:
        options["nvext"] = {"extra_fields": ["worker_id"]}
    options.update(extra_body or {})
    payloads = _payloads(prompt_list, model, endpoint, stream, max_tokens, options)
    counts = [requests or max(int(4 * c), 16) for c in levels]
    target = base + ENDPOINTS[endpoint]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    records: list[dict[str, Any]] = []

    async with LeanHttpClient(new_connection=new_connection, headers=headers) as client:
        origin = perf_counter()

        async def one(index: int, level: float) -> dict[str, Any]:
            record: dict[str, Any] = dict.fromkeys(RECORD_COLUMNS)
            record.update(label=label, index=index, prompt=prompt_list[index % len(prompt_list)].name)
            if rates is None:
                record["concurrency"] = level
            else:
                record["rate"] = level
            payload = payloads[index % len(payloads)]
            return await send_request(
                client, target, payload, record, stream=stream, timeout=timeout, origin=origin
            )

        for i in range(warmup):
            await one(i, 1)
        prefix = f"{label} · " if label else ""  # several bars in one cell: each says which run it is
        bar = progress_bar(total=sum(counts), desc=f"{prefix}bench", enabled=progress)
        if live is not None:
            live.start(records)
        try:
            arrivals = random.Random(seed)
            for level, count in zip(levels, counts, strict=True):
                if rates is None:
                    bar.set_description(f"{prefix}concurrency {level}")
                    await _level(one, int(level), count, records, bar.update)
                else:
                    bar.set_description(f"{prefix}{level:g} req/s")
                    await _open_loop(one, level, count, records, bar.update, arrivals)
        finally:
            bar.close()
            if live is not None:
                await live.stop()
    return records_frame(records)


async def _level(
    one: Callable[[int, int], Awaitable[dict[str, Any]]],
    level: int,
    count: int,
    records: list[dict[str, Any]],
    tick: Callable[[int], object],
) -> None:
    """``level`` clients share ``count`` request indices; each sends the next when one ends."""
    indices = iter(range(count))

    async def client() -> None:
        for index in indices:
            records.append(await one(index, level))
            tick(1)

    await asyncio.gather(*(client() for _ in range(min(level, count))))


async def _open_loop(
    one: Callable[[int, float], Awaitable[dict[str, Any]]],
    rate: float,
    count: int,
    records: list[dict[str, Any]],
    tick: Callable[[int], object],
    arrivals: random.Random,
) -> None:
    """``count`` requests arriving at ``rate`` per second (exponential gaps), each sent at its
    time whether or not earlier ones have ended; returns when every one has."""

    async def send(index: int) -> None:
        records.append(await one(index, rate))
        tick(1)

    loop = asyncio.get_running_loop()
    start = loop.time()
    due = 0.0
    tasks = []
    for index in range(count):
        wait = start + due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.ensure_future(send(index)))
        due += arrivals.expovariate(rate)
    await asyncio.gather(*tasks)


async def wait_for_model(url: str, model: str, *, instances: int = 0, timeout: float = 120.0) -> list[str]:
    """Wait until ``GET /v1/models`` lists ``model`` (and ``/health`` shows at least
    ``instances`` workers serving it); the listed model names.

    Works with any OpenAI-compatible server; ``instances`` needs our frontend's ``/health``
    (instances by model) or Dynamo's (instances by endpoint, with no model: there the workers of
    a ``generate`` endpoint are counted, and a frontend listing more than one model is refused,
    as its ``/health`` cannot say which serves ``model``). Raises `TimeoutError` naming what was
    last seen.

    Example::

        await bench.wait_for_model(frontend.url, "tiny-llama", instances=2)
        # ['tiny-llama']
    """
    base = _base_url(url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen = "no answer"
    while True:
        health = None
        try:
            names = [
                m.get("id") for m in json.loads((await fetch(base + "/v1/models", timeout=5))[1])["data"]
            ]
            seen = f"models {names}"
            if model in names and instances > 0:
                health = json.loads((await fetch(base + "/health", timeout=5))[1])
        except (ConnectionError, TimeoutError, ValueError, AttributeError, KeyError, TypeError) as exc:
            names, seen = [], f"{type(exc).__name__}: {exc}"
        if model in names and instances <= 0:
            return names
        if health is not None:
            serving = _instances_serving(health, model, names)  # a ConfigError where it cannot tell
            seen += f", {serving} instance(s) of {model!r}"
            if serving >= instances:
                return names
        if loop.time() >= deadline:
            raise NoInstancesError(
                f"{model!r} was not ready at {base} within {timeout:g} s (last seen: {seen})"
            )
        await asyncio.sleep(0.2)
