"""Profile a live engine into a timing model: `profile` measures, through the kit's frontend, how
long a prefill takes over input length and how long a decode step takes over batch size and
context length, on whatever engine serves the model (hf, vLLM, the mocker, an upstream server);
the result is a `dynamo_nb.engines.mocker_timing.TimingProfile`, which writes Dynamo's
profile-data folder and which the mocker and replay load (``--planner-profile-data``).

How it measures:

- prefill: one request at a time of ``n`` random token ids (nothing cached) and one output
  token: the frontend's ``nvext.timing`` ``prefill_time_ms`` (from being let in to the first
  token, so the client's costs are left out), the median of ``repeats``;
- prefill after a cached prefix: a prompt of ``prefix`` random ids sent once (so the engine
  caches it), then the same ids and ``n`` new ones, timed as above; the cached count is the
  engine's own (``usage.prompt_tokens_details.cached_tokens``), and an engine that cached
  nothing gives an uncached point;
- decode: ``batch`` streamed requests at once with prompts of ``context`` random ids and
  ``decode_tokens`` outputs each (``ignore_eos``): the mean gap between tokens as the client
  reads them while every stream of the batch decodes (the engine's step with the frontend's and
  the stream's cost per token, which share the machine with it, as in a live run; the prompts'
  prefills left out), the median over the batch, then over ``repeats`` rounds; its context is
  ``context + decode_tokens / 2`` on average;
- between the client and the engine: each prefill request's time at the client less the
  frontend's own ``total_time_ms`` (HTTP both ways), the median: ``request_overhead_ms``.

From a shell, ``python -m dynamo_nb profile --url http://127.0.0.1:8000 --model tiny-llama --out DIR``
writes the folder and prints the fit with each point's error.

Example::

    from dynamo_nb import bench
    measured = await bench.profile("http://127.0.0.1:8000", "tiny-llama")
    measured.write("profiles/tiny-llama")          # Dynamo's layout
    # python components/mocker_worker.py --planner-profile-data profiles/tiny-llama
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ..engines.mocker_timing import TimingProfile
from ..errors import RequestError
from .progress import progress_bar

__all__ = ["main", "profile"]

PREFILL_TOKENS = (16, 64, 128, 256, 512)
CACHED_PREFIXES = (128, 384)
NEW_AFTER_PREFIX = (16, 64, 256)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (32, 128, 384)


async def profile(
    url: str,
    model: str,
    *,
    prefill_tokens: Sequence[int] = PREFILL_TOKENS,
    cached_prefixes: Sequence[int] = CACHED_PREFIXES,
    new_after_prefix: Sequence[int] = NEW_AFTER_PREFIX,
    batches: Sequence[int] = BATCHES,
    contexts: Sequence[int] = CONTEXTS,
    decode_tokens: int = 24,
    repeats: int = 3,
    vocab: int = 1000,
    max_kv_tokens: int = 262144,
    seed: int = 0,
    timeout: float = 120.0,
    progress: bool = True,
) -> TimingProfile:
    """Measure the engine serving ``model`` behind the kit's frontend at ``url`` (see the module
    docstring); ``vocab``: token ids are drawn below it (the model's vocabulary must be as large).

    Raises:
        RequestError: a request failed (its status and message).
    """
    draw = random.Random(seed)
    total = len(prefill_tokens) * repeats + sum(len(contexts) * batch * repeats for batch in batches)
    total += len(cached_prefixes) * len(new_after_prefix) * repeats
    bar = progress_bar(total, "profile", progress)
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
        measured = TimingProfile(max_kv_tokens=max_kv_tokens, source=f"{url} {model}")
        await _timed(http, model, _prompt(draw, 8, vocab), 1)  # warm up: the first request pays for loading
        overheads: list[float] = []  # each prefill request's time outside the frontend's own account
        for tokens in prefill_tokens:
            bar.set_description(f"prefill {tokens} tokens")
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                timing = await _timed(http, model, _prompt(draw, tokens, vocab), 1)
                overheads.append((time.perf_counter() - started) * 1000 - float(timing["total_time_ms"]))
                times.append(float(timing["prefill_time_ms"]))
                bar.update(1)
            measured.prefill.append((tokens, statistics.median(times)))
        for prefix_tokens in cached_prefixes:
            for tokens in new_after_prefix:
                bar.set_description(f"prefill {tokens} tokens after {prefix_tokens} cached")
                points = []
                for _ in range(repeats):
                    prefix = _prompt(draw, prefix_tokens, vocab)
                    await _timed(http, model, prefix, 1)  # the engine caches it
                    timing, cached = await _timed_with_cached(
                        http, model, prefix + _prompt(draw, tokens, vocab)
                    )
                    points.append((cached, float(timing["prefill_time_ms"])))
                    bar.update(1)
                cached = statistics.median_low(count for count, _ in points)
                ms = statistics.median(ms for _, ms in points)
                if cached:
                    measured.prefill_after_prefix.append((cached, prefix_tokens + tokens - cached, ms))
                else:
                    measured.prefill.append((prefix_tokens + tokens, ms))
        for batch in batches:
            for context in contexts:
                bar.set_description(f"decode batch {batch}, context {context}")
                rounds = []
                for _ in range(repeats):
                    arrivals = await asyncio.gather(
                        *(
                            _streamed_arrivals(http, model, _prompt(draw, context, vocab), decode_tokens)
                            for _ in range(batch)
                        )
                    )
                    rounds.append(_steady_gap_ms(arrivals))
                    bar.update(batch)
                measured.decode.append((batch, context + decode_tokens / 2, statistics.median(rounds)))
    measured.request_overhead_ms = max(statistics.median(overheads), 0.0)
    bar.close()
    return measured


def _prompt(draw: random.Random, tokens: int, vocab: int) -> list[int]:
    return [draw.randrange(10, vocab) for _ in range(tokens)]


async def _timed(http: Any, model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The frontend's ``nvext.timing`` of one completion of exactly ``max_tokens`` tokens."""
    timing: dict[str, Any] = (await _answer(http, model, prompt, max_tokens))["nvext"]["timing"]
    return timing


async def _timed_with_cached(http: Any, model: str, prompt: list[int]) -> tuple[dict[str, Any], int]:
    """One output token's ``nvext.timing`` and the prompt tokens the engine found cached."""
    data = await _answer(http, model, prompt, 1)
    details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
    timing: dict[str, Any] = data["nvext"]["timing"]
    return timing, int(details.get("cached_tokens") or 0)


async def _answer(http: Any, model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """A completion of exactly ``max_tokens`` tokens with the frontend's ``nvext.timing``."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "nvext": {"extra_fields": ["timing"]}}  # fmt: skip
    answer = await http.post("/v1/completions", json=body)
    data = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else None
    timing = (data.get("nvext") or {}).get("timing") if isinstance(data, dict) else None
    if answer.status_code != 200 or not isinstance(data, dict) or not isinstance(timing, dict):
        raise RequestError(
            f"profile: {model} answered {answer.status_code}: {answer.text[:300]} (profile a model served by the "
            "kit's frontend: its nvext.timing is what is measured)"
        )
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m dynamo_nb profile``: measure, write the profile folder, print the fit."""
    from ..engines.mocker_timing import ProfiledTiming

    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb profile",
        description="Measure the engine behind a kit frontend into a timing model, written in Dynamo's "
        "profile-data layout (the mocker and replay load it with --planner-profile-data DIR).",
    )
    parser.add_argument("--url", required=True, help="the kit's frontend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--vocab", type=int, default=1000, help="token ids are drawn below this")
    parser.add_argument("--repeats", type=int, default=3, help="prefill measurements per length")
    args = parser.parse_args(argv)
    measured = asyncio.run(profile(args.url, args.model, vocab=args.vocab, repeats=args.repeats))
    folder = measured.write(args.out)
    model = ProfiledTiming.fit(measured)
    errors = model.residuals()
    print(model)
    for kind in ("prefill", "decode"):
        worst = max(abs(e) for e in errors[kind])
        print(f"{kind}: {len(errors[kind])} points, the fit within {worst:.1f} % of each")
    print("wrote", folder)
    return 0


async def _streamed_arrivals(http: Any, model: str, prompt: list[int], max_tokens: int) -> list[float]:
    """When each token of a streamed answer reached the client (``time.perf_counter`` seconds)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}  # fmt: skip
    arrivals: list[float] = []
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        if answer.status_code != 200:
            raise RequestError(
                f"profile: {model} answered {answer.status_code}: {(await answer.aread())[:300]!r}"
            )
        async for line in answer.aiter_lines():
            if line.startswith("data: {") and '"text"' in line:
                arrivals.append(time.perf_counter())
    if len(arrivals) < 2:
        raise RequestError(f"profile: {model} streamed {len(arrivals)} tokens, asked for {max_tokens}")
    return arrivals


def _steady_gap_ms(arrivals: Sequence[list[float]]) -> float:
    """The gap between tokens while the whole batch decodes: from the last stream's first token
    to the first stream's last, the median over the streams (the prompts' prefills, which an
    engine may spread over several steps, and the batch's ragged end are left out: a replay
    adds its prefills to the steps they share). A batch whose streams barely overlap falls back
    to each stream's own mean gap."""
    start, end = max(times[0] for times in arrivals), min(times[-1] for times in arrivals)
    gaps = []
    for times in arrivals:
        inside = [t for t in times if start <= t <= end]
        if len(inside) < 4:
            inside = times
        gaps.append((inside[-1] - inside[0]) * 1000 / (len(inside) - 1))
    return statistics.median(gaps)
