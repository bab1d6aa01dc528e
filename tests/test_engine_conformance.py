"""The Engine conformance suite: what every engine (echo, hf, mocker, vllm, sglang, and the next one) must do.

Each test runs against every engine in ``ENGINES``. What an engine cannot do by design is
declared in ``LIMITS`` with the reason, and those tests skip for it with that reason (echo and
the mocker stream the prompt back, so they have no eos, sampling or vocabulary). A new engine
adds a fixture branch in ``engine`` and its line in ``LIMITS``. Engines with prefill and
decode roles (`DisaggregatedEngine`) also hand a prefilled prompt's KV to a decode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import collect, req

from dynamo_nb.disagg.roles import DisaggregatedEngine
from dynamo_nb.disagg.rooms import draw_room, draw_token
from dynamo_nb.engines.base import Engine
from dynamo_nb.errors import InvalidRequestError
from dynamo_nb.llm import engine_handler
from dynamo_nb.runtime.context import Context

ENGINES = [
    "echo",
    "hf",
    "mocker",
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.processes]),  # its engine core is a process
    "sglang-fake",
    pytest.param("hf-cuda", marks=pytest.mark.gpu),
]

LIMITS: dict[str, dict[str, str]] = {
    "echo": {
        "prefix": "echo keeps no KV cache",
        "eos": "echo streams the prompt back: no eos",
        "sampling": "echo streams the prompt back: nothing is sampled",
        "vocab": "echo has no vocabulary",
    },
    "mocker": {
        "eos": "the mocker streams the prompt back: no eos",
        "sampling": "the mocker streams the prompt back: nothing is sampled",
        "vocab": "the mocker has no vocabulary",
        "context": "the mocker has no context length",
    },
    "hf": {},
    "hf-cuda": {},
    "vllm": {
        "handoff": "vLLM's KV connector is set when the engine starts: tests/test_vllm_worker.py runs "
        "prefill → decode between two vLLM workers",
    },
    "sglang-fake": {  # SGLang's stand-in (no GPU here): our engine code against SGLang's API shapes
        "prefix": "the stand-in has no radix cache (it reports 0 cached tokens, passed on as SGLang's "
        "meta_info.cached_tokens: tests/test_sglang_contract.py checks SGLang sends that key)",
        "handoff": "an SGLang engine's role is fixed when it starts (--disaggregation-mode): "
        "tests/test_sglang_worker.py runs prefill → decode between two workers",
    },
}

PROMPT = list(range(10, 50))  # 40 tokens: more than one KV block for every engine


def needs(engine_name: str, capability: str) -> None:
    reason = LIMITS[engine_name].get(capability)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module", params=ENGINES)
async def engine(request: pytest.FixtureRequest, tiny_path: Path) -> AsyncIterator[Any]:
    """One engine of each kind for the module; ``engine.name`` says which."""
    name = request.param
    events: list[Any] = []

    async def sink(event: Any) -> None:
        events.append(event)

    if name == "echo":
        from dynamo_nb.engines import EchoEngine

        made: Any = EchoEngine(context_length=1024)
    elif name in ("hf", "hf-cuda"):
        from dynamo_nb.engines import HFEngine

        device = "cpu"
        if name == "hf-cuda":
            device = "cuda"  # marked gpu: skipped without CUDA
        made = await HFEngine.load(tiny_path, device=device, kv_events=sink)
    elif name == "mocker":
        from dynamo_nb.engines import MockerEngine

        made = MockerEngine(speedup_ratio=100.0, kv_events=sink)
    elif name == "sglang-fake":
        from dynamo_nb.engines.sglang import SglangEngine
        from dynamo_nb.flags import sglang_worker_parser

        args = sglang_worker_parser().parse_args(["--fake-engine", "--context-length", "1024"])
        made = await SglangEngine.from_args(args, tiny_path, kv_events=sink)
    else:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from dynamo_nb.engines.vllm import VllmEngine, cpu_engine_defaults

        args = AsyncEngineArgs(model=str(tiny_path), enforce_eager=True, **cpu_engine_defaults())
        made = await VllmEngine.start(args, kv_events=sink)
    made.name = name
    made.events_seen = events
    yield made
    await made.close()


def request(max_tokens: int = 8, **extra: Any) -> Any:
    sampling = extra.pop("sampling_options", {"temperature": 0})
    stop = {"max_tokens": max_tokens, **extra.pop("stop_conditions", {})}
    return req({"token_ids": PROMPT, "stop_conditions": stop, "sampling_options": sampling, **extra})


def tokens_of(items: list[dict[str, Any]]) -> list[int]:
    return [token for item in items for token in item["token_ids"]]


async def wait_idle(engine: Any, timeout: float = 10.0) -> None:
    """Until the engine holds no request (its own count), or fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while engine.active:
        assert loop.time() < deadline, f"{engine.name} still holds {engine.active} request(s)"
        await asyncio.sleep(0.05)


async def test_streams_deltas_then_one_final_item_with_usage(engine: Any) -> None:
    items = await collect(engine.generate(request(max_tokens=6, stop_conditions={"ignore_eos": True})))
    *middle, last = items
    assert all(isinstance(item["token_ids"], list) and "finish_reason" not in item for item in middle)
    assert last["finish_reason"] == "length"
    assert tokens_of(items) and len(tokens_of(items)) == 6
    usage = dict(last["completion_usage"])
    details = usage.pop("prompt_tokens_details")  # OpenAI's: what aiperf reads
    assert usage == {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}
    assert 0 <= details["cached_tokens"] <= 40  # this module's engine may have seen the prompt


async def test_a_prompt_seen_before_reports_the_tokens_it_found_cached(engine: Any) -> None:
    """``usage.prompt_tokens_details.cached_tokens``: 0 for a new prompt; for the same prompt
    again, the cached prefix the engine really reused (whole KV blocks, never the whole prompt:
    its last token is always computed)."""
    needs(engine.name, "prefix")
    prompt = [(7 * i + 3) % 1500 + 20 for i in range(300)]  # long enough for whole blocks anywhere

    async def cached() -> int:
        stop = {"max_tokens": 2, "ignore_eos": True}
        items = await collect(engine.generate(req({"token_ids": prompt, "stop_conditions": stop})))
        return items[-1]["completion_usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached() == 0
    again = await cached()
    assert 0 < again < len(prompt)
    block = getattr(engine, "block_size", None)
    if block:
        assert again % block == 0 or again == len(prompt) - 1, (again, block)


async def test_max_tokens_ends_with_length(engine: Any) -> None:
    for max_tokens in (1, 3):
        items = await collect(
            engine.generate(request(max_tokens=max_tokens, stop_conditions={"ignore_eos": True}))
        )
        assert len(tokens_of(items)) == max_tokens and items[-1]["finish_reason"] == "length"


async def test_an_eos_token_ends_with_stop_after_min_tokens(engine: Any) -> None:
    needs(engine.name, "eos")
    free = tokens_of(await collect(engine.generate(request(max_tokens=12))))
    # the first token not seen before (so the stream cannot have stopped on it earlier)
    index = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    eos = free[index]
    stopped = await collect(engine.generate(request(max_tokens=12, eos_token_ids=[eos])))
    assert tokens_of(stopped) == free[: index + 1] and stopped[-1]["finish_reason"] == "stop"
    held = await collect(
        engine.generate(
            request(max_tokens=12, eos_token_ids=[eos], stop_conditions={"min_tokens": index + 3})
        )
    )
    assert len(tokens_of(held)) >= index + 3
    ignored = await collect(
        engine.generate(request(max_tokens=12, eos_token_ids=[eos], stop_conditions={"ignore_eos": True}))
    )
    assert tokens_of(ignored) == free and ignored[-1]["finish_reason"] == "length"


async def test_greedy_repeats_and_a_seed_repeats_its_sample(engine: Any) -> None:
    greedy = [tokens_of(await collect(engine.generate(request(max_tokens=10)))) for _ in range(2)]
    assert greedy[0] == greedy[1]
    needs(engine.name, "sampling")
    sampled = {"temperature": 1.0, "seed": 11}
    runs = [
        tokens_of(await collect(engine.generate(request(max_tokens=16, sampling_options=sampled))))
        for _ in range(2)
    ]
    other = tokens_of(
        await collect(engine.generate(request(max_tokens=16, sampling_options={**sampled, "seed": 12})))
    )
    assert runs[0] == runs[1] and other != runs[0] and runs[0] != greedy[0]


async def test_closing_a_stream_frees_the_request(engine: Any) -> None:
    stream = engine.generate(request(max_tokens=200, stop_conditions={"ignore_eos": True}))
    first = await anext(stream)
    await anext(stream)
    assert first.token_ids and engine.active == 1
    await stream.aclose()
    await wait_idle(engine)


async def test_a_stopped_context_ends_the_stream_with_cancelled(engine: Any) -> None:
    context = Context()
    items = []
    async with contextlib.aclosing(
        engine.generate(request(max_tokens=200, stop_conditions={"ignore_eos": True}), context)
    ) as stream:
        async for item in stream:
            items.append(item.to_dict())
            if len(items) == 2:
                context.stop_generating()
    assert items[-1]["finish_reason"] == "cancelled"
    assert len(tokens_of(items)) < 200
    assert items[-1]["completion_usage"]["completion_tokens"] == len(tokens_of(items))
    await wait_idle(engine)


async def test_concurrent_requests_interleave(engine: Any) -> None:
    finished: list[str] = []

    async def run(name: str, max_tokens: int) -> list[dict[str, Any]]:
        items = await collect(
            engine.generate(request(max_tokens=max_tokens, stop_conditions={"ignore_eos": True}))
        )
        finished.append(name)
        return items

    long, short = await asyncio.gather(run("long", 64), run("short", 3))
    assert finished == ["short", "long"]
    assert len(tokens_of(long)) == 64 and len(tokens_of(short)) == 3


async def test_a_prompt_past_the_context_is_refused(engine: Any) -> None:
    needs(engine.name, "context")
    too_long = req({"token_ids": [5] * 1024, "stop_conditions": {"max_tokens": 4}})
    with pytest.raises(InvalidRequestError, match="context"):
        await collect(engine.generate(too_long))


async def test_a_token_outside_the_vocabulary_is_refused(engine: Any) -> None:
    needs(engine.name, "vocab")
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        await collect(engine.generate(req({"token_ids": [5, 10**6], "stop_conditions": {"max_tokens": 2}})))


@pytest.mark.parametrize(
    ("options", "param"),
    [({"temperature": 5}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 1.5}, "top_p")],
)
async def test_bad_sampling_options_are_a_clear_error(
    engine: Any, options: dict[str, Any], param: str
) -> None:
    handler = engine_handler(engine.generate)  # what the worker serves
    with pytest.raises(InvalidRequestError, match=param) as caught:
        await collect(handler({"token_ids": PROMPT, "sampling_options": options}))
    assert caught.value.param == param
    await wait_idle(engine)


async def test_kv_events_describe_full_prompt_blocks(engine: Any) -> None:
    if engine.name == "echo":
        pytest.skip("echo has no KV cache")
    await collect(engine.generate(request(max_tokens=2)))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not any(isinstance(e, dict) and "stored" in e for e in engine.events_seen):
        assert loop.time() < deadline, f"{engine.name} sent no stored KV event"
        await asyncio.sleep(0.05)
    stored = [
        block
        for e in engine.events_seen
        if isinstance(e, dict) and "stored" in e
        for block in e["stored"]["blocks"]
    ]
    from dynamo_nb.router.kv.hashing import block_hashes

    expected = block_hashes(PROMPT, engine.block_size)
    assert expected and set(expected) <= {block["tokens_hash"] for block in stored}
    assert engine.kv_snapshot(), "the snapshot rebuilds the blocks it holds"


async def test_it_declares_what_the_serving_code_reads(engine: Any) -> None:
    assert isinstance(engine, Engine)
    for name in ("max_num_seqs", "block_size", "context_length"):
        value = getattr(engine, name)
        assert value is None or (isinstance(value, int) and value > 0), (name, value)
    assert isinstance(engine.active, int) and engine.active == 0
    if isinstance(engine, DisaggregatedEngine):
        assert engine.kv_timeout > 0
        endpoint = engine.handoff_endpoint
        assert endpoint is None or {"bootstrap_host", "bootstrap_port"} <= set(endpoint)


async def test_a_prefill_hands_its_kv_to_a_decode_on_both_paths(engine: Any) -> None:
    """Every engine with prefill and decode roles: the decode of a prefilled prompt gives the
    aggregated tokens, whether the room comes with the request (fast path) or from the prefill
    (fallback path)."""
    if not isinstance(engine, DisaggregatedEngine):
        pytest.skip(f"{engine.name} has no prefill and decode roles")
    needs(engine.name, "handoff")
    greedy = {"stop_conditions": {"ignore_eos": True}}
    aggregated = tokens_of(await collect(engine.generate(request(max_tokens=6, **greedy))))
    await engine.start_bootstrap()
    endpoint = engine.handoff_endpoint
    assert endpoint is not None, "a started bootstrap server is published as the handoff endpoint"

    info = {**endpoint, "bootstrap_room": draw_room(), "bootstrap_token": draw_token()}
    decoding = asyncio.ensure_future(
        collect(engine.decode(request(max_tokens=6, bootstrap_info=info, **greedy)))
    )
    prefill = await collect(engine.prefill(request(max_tokens=6, bootstrap_info=info, **greedy)))
    assert prefill[0]["disaggregated_params"] == info and len(tokens_of(prefill)) == 1
    assert tokens_of(await decoding) == aggregated

    prefill = await collect(engine.prefill(request(max_tokens=6, **greedy)))
    params = prefill[0]["disaggregated_params"]
    fallback = {"prefill_result": {"disaggregated_params": params}}
    assert tokens_of(await collect(engine.decode(request(max_tokens=6, **fallback, **greedy)))) == aggregated
    await wait_idle(engine)


async def test_check_engine_passes_on_every_engine_of_the_kit(engine: Any) -> None:
    """`check_engine`, the checks a notebook runs on a new engine, agree with this suite: every
    engine of the kit passes them (so a failure on a new engine is the engine's)."""
    from dynamo_nb.engines import check_engine

    report = await check_engine(engine, prompt=PROMPT)
    assert report.passed, report
    await wait_idle(engine)
