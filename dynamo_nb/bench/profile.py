"""Profile a live engine into a timing model: `profile` measures, through the kit's frontend, how
long a prefill takes over input length and how long a decode step takes over batch size and
context length, on whatever engine serves the model (hf, vLLM, the mocker, an upstream server);
the result is a `dynamo_nb.engines.mocker_timing.TimingProfile`, which writes Dynamo's
profile-data folder and which the mocker and replay load (``--planner-profile-data``).

How it measures:

- decode: ``batch`` streamed requests at once with prompts of ``context`` random ids (± 25 %,
  evenly spread: a live batch's members differ in length, see `ragged_lengths`) and
  ``decode_tokens`` outputs each (``ignore_eos``): the mean gap between tokens as the client
  reads them while every stream of the batch decodes (the engine's step with the frontend's and
  the stream's cost per token, which share the machine with it, as in a live run; the prompts'
  prefills left out), the median over the batch, then over ``repeats`` rounds; its context is
  ``context + decode_tokens / 2`` on average;
- prefill: what a prompt of ``n`` random token ids (nothing cached) and one output token adds
  to the steps of ``load_streams`` other requests that decode meanwhile (as in a live run, where
  a prompt arrives among running requests and its prefill and the worker's work for it share
  the engine with them): the time their tokens took from the prompt's sending to the step after
  its answer, less their usual gap times the tokens that came, the median over the streams and
  of ``repeats``; kept as the first token the fitted model gives on an idle engine (that, plus
  a decode step of one sequence, as Dynamo's profile keeps TTFT). With ``load_streams=0``, each
  prompt alone on an idle engine instead: the frontend's ``nvext.timing`` ``prefill_time_ms``
  (from being let in to the first token), the median of ``repeats``;
- prefill after a cached prefix: a prompt of ``prefix`` random ids sent once (so the engine
  caches it), then the same ids and ``n`` new ones, timed as above; the cached count is the
  engine's own (``usage.prompt_tokens_details.cached_tokens``), and an engine that cached
  nothing gives an uncached point;
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
import contextlib
import functools
import itertools
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from ..engines.mocker_timing import ProfiledTiming, TimingProfile
from ..errors import RequestError
from .arguments import comma_separated_sizes
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
    load_streams: int = 8,
    temperature: float | None = None,
    repeats: int = 3,
    vocab: int = 1000,
    max_kv_tokens: int = 262144,
    seed: int = 0,
    timeout: float = 120.0,
    progress: bool = True,
) -> TimingProfile:
    """Measure the engine serving ``model`` behind the kit's frontend at ``url`` (see the module
    docstring); ``vocab``: token ids are drawn below it (the model's vocabulary must be as large);
    ``load_streams``: the decoding requests a prefill is measured among (0: alone);
    ``temperature``: sent with every request when given (else the server's default, as
    `dynamo_nb.bench.run` and `run_trace` send): measure with the sampling your traffic uses,
    since sampling a token costs an engine more than taking the likeliest one.

    Raises:
        RequestError: a request failed (its status and message).
    """
    draw = random.Random(seed)
    sampling = {} if temperature is None else {"temperature": temperature}
    total = len(prefill_tokens) * repeats + sum(len(contexts) * batch * repeats for batch in batches)
    total += len(cached_prefixes) * len(new_after_prefix) * repeats
    bar = progress_bar(total, "profile", progress)
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=timeout) as http:
        measured = TimingProfile(max_kv_tokens=max_kv_tokens, source=f"{url} {model}")
        # warm up: the first requests pay for loading and for the largest batch's first shapes
        await _timed(http, model, _prompt(draw, 8, vocab), 1, sampling)
        await asyncio.gather(
            *(
                _streamed_arrivals(http, model, _prompt(draw, length, vocab), 4, sampling)
                for length in ragged_lengths(max(contexts), max(batches))
            )
        )
        for batch in batches:
            for context in contexts:
                bar.set_description(f"decode batch {batch}, context {context}")
                rounds = []
                for _ in range(repeats):
                    arrivals = await asyncio.gather(
                        *(
                            _streamed_arrivals(
                                http, model, _prompt(draw, length, vocab), decode_tokens, sampling
                            )
                            for length in ragged_lengths(context, batch)
                        )
                    )
                    rounds.append(_steady_gap_ms(arrivals))
                    bar.update(batch)
                measured.decode.append((batch, context + decode_tokens / 2, statistics.median(rounds)))
        prefill = _PrefillProbe(http, model, measured, load_streams, sampling, repeats)
        # the streams' prompts and outputs within the contexts measured: they fit the model's context
        async with prefill.among_streams(
            functools.partial(_prompt, draw, min(contexts), vocab), max(contexts)
        ):
            for tokens in prefill_tokens:
                bar.set_description(f"prefill {tokens} tokens")
                ms, _ = await prefill.measure(functools.partial(_prompt, draw, tokens, vocab))
                measured.prefill.append((tokens, ms))
                bar.update(repeats)
            for prefix_tokens in cached_prefixes:
                for tokens in new_after_prefix:
                    bar.set_description(f"prefill {tokens} tokens after {prefix_tokens} cached")
                    prefix = _prompt(draw, prefix_tokens, vocab)
                    await _timed(http, model, prefix, 1, sampling)  # the engine caches it
                    ms, cached = await prefill.measure(
                        functools.partial(_after, prefix, draw, tokens, vocab), cached=True
                    )
                    if cached:
                        measured.prefill_after_prefix.append((cached, prefix_tokens + tokens - cached, ms))
                    else:
                        measured.prefill.append((prefix_tokens + tokens, ms))
                    bar.update(repeats)
        overheads = prefill.overheads
    measured.request_overhead_ms = max(statistics.median(overheads), 0.0)
    bar.close()
    return measured


class _PrefillProbe:
    """Times prefills: alone (``streams`` 0: the frontend's ``prefill_time_ms``, the median of
    ``repeats``) or as what each costs ``streams`` decoding requests (see the module docstring)."""

    ATTEMPTS = 5  # probes sent for one point before no stream spanning any of them is an error

    def __init__(
        self,
        http: Any,
        model: str,
        measured: TimingProfile,
        streams: int,
        sampling: dict[str, Any],
        repeats: int,
    ) -> None:
        self.http, self.model, self.streams, self.sampling = http, model, streams, sampling
        self.repeats = repeats
        self.measured = (
            measured  # its decode grid turns a step's prefill into a first token on an idle engine
        )
        self.overheads: list[float] = []  # each probe's time outside the frontend's own account
        self._decode: ProfiledTiming | None = None
        self._arrivals: list[list[float]] = [[] for _ in range(streams)]  # each stream's tokens

    @contextlib.asynccontextmanager
    async def among_streams(self, prompt: Callable[[], list[int]], tokens: int) -> AsyncIterator[None]:
        """Keep ``streams`` requests of ``prompt()`` and ``tokens`` output tokens decoding (each sent
        again when it ends) while inside."""
        tasks = [
            asyncio.create_task(self._keep_streaming(index, prompt, tokens)) for index in range(self.streams)
        ]
        try:
            deadline = time.monotonic() + 60
            while any(len(times) < 4 for times in self._arrivals):  # every stream decodes
                if time.monotonic() > deadline or any(task.done() for task in tasks):
                    for task in tasks:
                        if task.done():
                            task.result()  # its error
                    raise RequestError(
                        f"profile: {self.model} did not stream {self.streams} requests at once"
                    )
                await asyncio.sleep(0.01)
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_streaming(self, index: int, prompt: Callable[[], list[int]], tokens: int) -> None:
        while True:
            await _streamed_arrivals(self.http, self.model, prompt(), tokens, self.sampling,
                                     into=self._arrivals[index])  # fmt: skip
            self._arrivals[index].append(-1.0)  # a new request: no gap across it

    async def measure(self, prompt: Callable[[], list[int]], cached: bool = False) -> tuple[float, int]:
        """A ``prompt()``'s prefill in ms (as a first token on an idle engine) and the tokens the
        engine found cached, the median of ``repeats`` prompts: alone, the frontend's
        ``prefill_time_ms``; among the streams, what each prompt added to their tokens' time."""
        points = [
            await (
                self._probe(prompt(), cached) if not self.streams else self._among_streams(prompt(), cached)
            )
            for _ in range(self.repeats)
        ]
        return statistics.median(ms for ms, _ in points), statistics.median_low(n for _, n in points)

    async def _among_streams(self, prompt: list[int], cached: bool) -> tuple[float, int]:
        """The time the streams' tokens took from the prompt's sending to the step after its
        answer, less their usual gap times the tokens that came (the median over the streams),
        plus a decode step of one sequence: the prompt's cost as a first token on an idle engine.
        A probe during which every stream ended or sent nothing (a fast engine's short streams, a
        stalled machine) tells nothing: it is sent again, up to ``ATTEMPTS`` times."""
        for _ in range(self.ATTEMPTS - 1):
            with contextlib.suppress(_NoStreamSpanned):
                return await self._among_streams_once(prompt, cached)
        return await self._among_streams_once(prompt, cached)

    async def _among_streams_once(self, prompt: list[int], cached: bool) -> tuple[float, int]:
        seen = [len(times) for times in self._arrivals]
        _, cached_tokens = await self._probe(prompt, cached)
        answered = time.perf_counter()
        steady = [
            statistics.median(gaps[-20:])
            for times, before in zip(self._arrivals, seen, strict=True)
            if (gaps := [b - a for a, b in itertools.pairwise(times[:before]) if a > 0 and b > 0])
        ]
        if not steady:
            raise RequestError(f"profile: the other streams of {self.model} sent no tokens before a prompt")
        usual = statistics.median(steady)
        await asyncio.sleep(1.5 * usual)  # the step after the answer's, read too
        added = []
        for times, before in zip(self._arrivals, seen, strict=True):
            inside = times[before:]
            if before < 1 or times[before - 1] <= 0 or -1.0 in inside:
                continue  # a stream that started again meanwhile: no steady gaps to compare with
            inside = [t for t in inside if t <= answered + usual]
            if inside:
                added.append(inside[-1] - times[before - 1] - len(inside) * usual)
        if not added:
            raise _NoStreamSpanned(
                f"profile: no token of the other streams came while {self.model} answered a prompt"
                f" ({self.ATTEMPTS} prompts): give it more load_streams or a longer decode"
            )
        if self._decode is None:
            self._decode = ProfiledTiming.fit_decode(self.measured)
        return max(statistics.median(added), 0.0) * 1000 + self._decode.first_decode_ms(
            len(prompt)
        ), cached_tokens

    async def _probe(self, prompt: list[int], cached: bool) -> tuple[float, int]:
        """One prompt with one output token: the frontend's ``prefill_time_ms`` and its cached tokens."""
        started = time.perf_counter()
        data = await _answer(self.http, self.model, prompt, 1, self.sampling)
        timing = data["nvext"]["timing"]
        self.overheads.append((time.perf_counter() - started) * 1000 - float(timing["total_time_ms"]))
        details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
        return float(timing["prefill_time_ms"]), int(details.get("cached_tokens") or 0) if cached else 0


class _NoStreamSpanned(RequestError):
    """No decoding stream ran steadily through a probe: the probe measured nothing."""


def ragged_lengths(context: int, batch: int, spread: float = 0.25) -> list[int]:
    """``batch`` prompt lengths spread evenly over ``context`` ± ``spread``, averaging ``context``:
    a live batch's members differ in length (an engine that pads them to the longest, as the hf
    engine does, pays for the padding and the mask; equal lengths would hide that).

    Example:
        >>> ragged_lengths(100, 3)
        [75, 100, 125]
    """
    if batch == 1:
        return [context]
    return [round(context * (1 - spread + 2 * spread * index / (batch - 1))) for index in range(batch)]


def _prompt(draw: random.Random, tokens: int, vocab: int) -> list[int]:
    return [draw.randrange(10, vocab) for _ in range(tokens)]


def _after(prefix: list[int], draw: random.Random, tokens: int, vocab: int) -> list[int]:
    return prefix + _prompt(draw, tokens, vocab)


async def _timed(
    http: Any, model: str, prompt: list[int], max_tokens: int, sampling: dict[str, Any]
) -> dict[str, Any]:
    """The frontend's ``nvext.timing`` of one completion of exactly ``max_tokens`` tokens."""
    timing: dict[str, Any] = (await _answer(http, model, prompt, max_tokens, sampling))["nvext"]["timing"]
    return timing


async def _answer(
    http: Any, model: str, prompt: list[int], max_tokens: int, sampling: dict[str, Any]
) -> dict[str, Any]:
    """A completion of exactly ``max_tokens`` tokens with the frontend's ``nvext.timing``."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **sampling,
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
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb profile",
        description="Measure the engine behind a kit frontend into a timing model, written in Dynamo's "
        "profile-data layout (the mocker and replay load it with --planner-profile-data DIR).",
    )
    parser.add_argument("--url", required=True, help="the kit's frontend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--vocab", type=int, default=1000, help="token ids are drawn below this")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per point")
    parser.add_argument("--batches", type=comma_separated_sizes, default=BATCHES, metavar="N,N,…",
                        help=f"decode batch sizes (default: {','.join(map(str, BATCHES))})")  # fmt: skip
    parser.add_argument("--contexts", type=comma_separated_sizes, default=CONTEXTS, metavar="N,N,…",
                        help=f"decode context lengths (default: {','.join(map(str, CONTEXTS))}; within the "
                        "model's context, with room for 25 % more and the decoded tokens)")  # fmt: skip
    parser.add_argument("--temperature", type=float, default=None,
                        help="sent with every request (default: the server's, as your traffic's)")  # fmt: skip
    args = parser.parse_args(argv)
    measured = asyncio.run(
        profile(args.url, args.model, vocab=args.vocab, repeats=args.repeats, batches=args.batches,
                contexts=args.contexts, temperature=args.temperature)
    )  # fmt: skip
    folder = measured.write(args.out)
    model = ProfiledTiming.fit(measured)
    errors = model.residuals()
    print(model)
    for kind in ("prefill", "decode"):
        worst = max(abs(e) for e in errors[kind])
        print(f"{kind}: {len(errors[kind])} points, the fit within {worst:.1f} % of each")
    print("wrote", folder)
    return 0


async def _streamed_arrivals(
    http: Any,
    model: str,
    prompt: list[int],
    max_tokens: int,
    sampling: dict[str, Any],
    into: list[float] | None = None,
) -> list[float]:
    """When each token of a streamed answer reached the client (``time.perf_counter`` seconds),
    appended to ``into`` as they come when given."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **sampling,
            "stream": True}  # fmt: skip
    arrivals: list[float] = [] if into is None else into
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        if answer.status_code != 200:
            raise RequestError(
                f"profile: {model} answered {answer.status_code}: {(await answer.aread())[:300]!r}"
            )
        async for line in answer.aiter_lines():
            if line.startswith("data: {") and '"text"' in line:
                arrivals.append(time.perf_counter())
    if into is None and len(arrivals) < 2:
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
