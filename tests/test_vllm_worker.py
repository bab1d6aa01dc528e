"""The vLLM worker as real processes: a prefill and a decode worker (vLLM's NixlConnector on CPU
between them) behind the frontend; greedy disaggregated output equals aggregated, the model card
carries vLLM's block size, vLLM's KV events reach a KV router, a SIGKILLed worker fails its stream.

Skips (with the reason) when vLLM is not installed: ``python3 -m dynamo_nb install vllm``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, collect, free_port, random_schema

from dynamo_nb import DistributedRuntime, launch
from dynamo_nb.errors import RequestError
from dynamo_nb.llm.card import CARD_PREFIX, ModelCard
from dynamo_nb.router.kv.hashing import block_hashes
from dynamo_nb.router.kv.kv_events import KvIndexer
from dynamo_nb.runtime.program import parse_ready_line

pytestmark = [pytest.mark.vllm, pytest.mark.processes, pytest.mark.timeout(300)]  # vLLM starts processes

VLLM_WORKER = ROOT / "components" / "vllm_worker.py"
PROMPT = list(range(10, 110))  # 100 tokens: three full 32-token blocks
GREEDY = {"token_ids": PROMPT, "stop_conditions": {"max_tokens": 16}, "sampling_options": {"temperature": 0}}


@pytest.fixture(scope="module")
async def graph(services: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """A vLLM prefill worker, a vLLM decode worker and a frontend, over etcd + NATS.

    The engines run eagerly (``--enforce-eager``): the same outputs without torch.compile's
    minute of C++ compilation on a host whose compile cache is empty.

    The workers are launched into this session (their own process groups), so their nice values
    rank them against the engines' spinning processes; in sessions of their own a worker's event
    loop went unscheduled for 4-12 s on 2 cores (see docs/disaggregation.md, small CPU hosts)."""
    logs = tmp_path_factory.mktemp("vllm")
    common = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    eager = [*common, "--enforce-eager"]
    prefill, decode = await asyncio.gather(
        launch(
            VLLM_WORKER, *eager, "--mode", "prefill", cwd=ROOT, log_dir=logs, show_logs=False, timeout=240
        ),
        launch(VLLM_WORKER, *eager, "--mode", "decode", cwd=ROOT, log_dir=logs, show_logs=False, timeout=240),
    )
    port = free_port()
    frontend = await launch(
        FRONTEND,
        *common,
        "--http-port",
        str(port),
        "--tool-call-parser",
        "hermes",
        cwd=ROOT,
        log_dir=logs,
        show_logs=False,
        timeout=60,
    )
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)
    client = await runtime.endpoint("dynamo.backend.generate").client()
    await client.wait_for_instances(timeout=20)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        for _ in range(200):
            if (await http.get("/v1/models")).json()["data"] and (await http.get("/health")).json().get(
                "prefill_instances"
            ):
                break
            await asyncio.sleep(0.1)
    yield {"prefill": prefill, "decode": decode, "url": url, "runtime": runtime, "client": client}
    await runtime.shutdown(grace=0.5)
    await frontend.stop(timeout=10)
    await asyncio.gather(prefill.stop(timeout=30), decode.stop(timeout=30))


def tokens(items: list[dict[str, Any]]) -> list[int]:
    return [token for item in items for token in item["token_ids"]]


async def decode_stats(graph: dict[str, Any]) -> dict[str, int]:
    stats = await graph["runtime"].endpoint("dynamo.backend.stats").client()
    await stats.wait_for_instances(timeout=10)
    return (await collect(stats.round_robin({})))[0]


async def test_disaggregated_greedy_output_equals_aggregated(graph: dict[str, Any]) -> None:
    client = graph["client"]
    # aggregated: the decode worker's vLLM generates the whole answer itself
    aggregated = tokens(await collect(client.round_robin({**GREEDY, "extra_args": {"aggregated": True}})))
    before = await decode_stats(graph)
    # the decode worker asks the prefill worker itself (no bootstrap info, no prefill result)
    asked = tokens(await collect(client.round_robin(GREEDY)))
    # through the frontend: its prefill planner waits for vLLM's kv_transfer_params (fallback path)
    async with httpx.AsyncClient(base_url=graph["url"], timeout=60) as http:
        body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["x-dynamo-path"] == "fallback"
        usage = response.json()["usage"]
    after = await decode_stats(graph)
    assert len(aggregated) == 16 and asked == aggregated
    assert 0 <= usage.pop("prompt_tokens_details")["cached_tokens"] <= 100  # vLLM's num_cached_tokens
    assert usage == {"prompt_tokens": 100, "completion_tokens": 16, "total_tokens": 116}
    # vLLM's NIXL connector pulled the prompt's blocks from the prefill worker, twice
    assert after["kv_transfers"] - before["kv_transfers"] >= 2, (before, after)
    assert after["kv_transfer_failures"] == 0


async def test_vllm_enforces_a_requests_structured_output(graph: dict[str, Any]) -> None:
    """A request's guided_decoding becomes vLLM's own structured outputs: its answers match the
    regex, the choice and the JSON schema (vLLM's backend, compact JSON) and a Lark grammar
    (llguidance's syntax, as the hf engine takes it: the worker starts vLLM with its guidance backend)."""
    from dynamo_nb.llm import ModelTokenizer
    from dynamo_nb.models import tiny_model_path

    tokenizer = ModelTokenizer.load(tiny_model_path())
    client = graph["client"]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    cases = [("regex", "[a-z]{3}-[0-9]{2}", lambda text: re.fullmatch("[a-z]{3}-[0-9]{2}", text)),
             ("choice", ["yes", "no"], lambda text: text in ("yes", "no")),
             ("json", schema, lambda text: json.loads(text)["n"] in range(10))]  # fmt: skip
    for kind, spec, holds in cases:
        request = {**GREEDY, "stop_conditions": {"max_tokens": 40}, "extra_args": {"aggregated": True},
                   "guided_decoding": {"kind": kind, "spec": spec, "field": f"nvext.structured_outputs.{kind}"}}  # fmt: skip
        text = tokenizer.decode(tokens(await collect(client.round_robin(request))))
        assert holds(text), (kind, text)
    lark = {**GREEDY, "stop_conditions": {"max_tokens": 40}, "extra_args": {"aggregated": True},
            "guided_decoding": {"kind": "grammar", "spec": 'start: "ab" ("c" | "d")', "field": "nvext.structured_outputs.grammar"}}  # fmt: skip
    assert tokenizer.decode(tokens(await collect(client.round_robin(lark)))) in ("abc", "abd")


async def test_agent_clients_on_the_vllm_pair(graph: dict[str, Any]) -> None:
    """The official SDKs against the frontend over the vLLM prefill/decode pair: a forced tool
    call (its grammar enforced by vLLM) validates on chat, the Responses and the Messages APIs,
    streamed and whole alike, ``beta.chat.completions.parse`` fills a Pydantic model, and ten
    generated schemas under ``strict`` validate — each answer served by both workers."""
    import anthropic
    import jsonschema
    import openai
    import pydantic

    class Port(pydantic.BaseModel):
        harbour: str = pydantic.Field(max_length=8)
        ships: int = pydantic.Field(ge=0, le=99)

    add = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
           "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
    ask: Any = [{"role": "user", "content": "What is 2 + 3?"}]
    tools: Any = [{"type": "function", "function": {"name": "add", "parameters": add}}]
    async with openai.AsyncOpenAI(
        base_url=graph["url"] + "/v1", api_key="none", max_retries=0, timeout=120
    ) as sdk:
        completion = await sdk.chat.completions.create(
            model="tiny-llama", messages=ask, tools=tools, tool_choice="required", max_tokens=80, temperature=0,
            extra_body={"nvext": {"extra_fields": ["worker_id"]}},
        )  # fmt: skip
        workers = (completion.model_extra or {})["nvext"]["worker_id"]
        assert workers["prefill_worker_id"] is not None and workers["decode_worker_id"] is not None
        assert completion.choices[0].finish_reason == "tool_calls", completion.choices[0].message
        (call,) = completion.choices[0].message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), add)  # type: ignore[union-attr]
        parsed = await sdk.beta.chat.completions.parse(model="tiny-llama", messages=ask, response_format=Port,
                                                       max_tokens=80, temperature=0)  # fmt: skip
        assert isinstance(parsed.choices[0].message.parsed, Port)
        response = await sdk.responses.create(
            model="tiny-llama", input="What is 2 + 3?", max_output_tokens=80, temperature=0,
            tools=[{"type": "function", "name": "add", "parameters": add, "strict": True}],
            tool_choice={"type": "function", "name": "add"},
        )  # fmt: skip
        (item,) = [item for item in response.output if item.type == "function_call"]
        jsonschema.validate(json.loads(item.arguments), add)
        # streamed, each API reassembles to its unstreamed answer
        named: Any = {"model": "tiny-llama", "messages": ask, "tools": tools, "max_tokens": 80, "temperature": 0,
                      "tool_choice": {"type": "function", "function": {"name": "add"}}}  # fmt: skip
        whole = (await sdk.chat.completions.create(**named)).choices[0].message.tool_calls or []
        streamed = ""
        async for chunk in await sdk.chat.completions.create(**named, stream=True):
            for choice in chunk.choices:
                streamed += "".join(d.function.arguments or "" for d in choice.delta.tool_calls or [])  # type: ignore[union-attr]
        assert [call.function.arguments for call in whole] == [streamed]  # type: ignore[union-attr]
        async with sdk.responses.stream(
            model="tiny-llama", input="What is 2 + 3?", max_output_tokens=80, temperature=0,
            tools=[{"type": "function", "name": "add", "parameters": add, "strict": True}],
            tool_choice={"type": "function", "name": "add"},
        ) as stream:  # fmt: skip
            final = await stream.get_final_response()
        assert [i.arguments for i in final.output if i.type == "function_call"] == [item.arguments]
        # generated schemas under strict: every answer that vLLM enforced validates
        draw = random.Random(11)
        for seed in range(10):
            schema = random_schema(draw)
            answer = await sdk.chat.completions.create(
                model="tiny-llama", messages=ask, max_tokens=120, temperature=1.0, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
            )  # fmt: skip
            assert answer.choices[0].finish_reason == "stop", (schema, answer.choices[0])
            jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    async with anthropic.AsyncAnthropic(
        base_url=graph["url"], api_key="none", max_retries=0, timeout=120
    ) as claude:
        options: Any = {"model": "tiny-llama", "max_tokens": 80, "messages": ask,
                        "tools": [{"name": "add", "input_schema": add}], "tool_choice": {"type": "tool", "name": "add"},
                        "extra_body": {"temperature": 0}}  # fmt: skip
        message = await claude.messages.create(**options)
        async with claude.messages.stream(**options) as events:
            streamed_message = await events.get_final_message()
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == streamed_message.stop_reason == "tool_use"
    jsonschema.validate(use.input, add)
    assert [b.input for b in streamed_message.content if b.type == "tool_use"] == [use.input]


async def test_stop_strings_end_vllm_output_at_the_frontend(graph: dict[str, Any]) -> None:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    async with httpx.AsyncClient(base_url=graph["url"], timeout=60) as http:
        full = (await http.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        stop = full[len(full) // 2 : len(full) // 2 + 2]
        cut = (await http.post("/v1/completions", json={**body, "stop": [stop]})).json()["choices"][0]
    assert stop and cut["text"] == full[: full.index(stop)] and cut["finish_reason"] == "stop"


async def test_a_decode_request_with_bad_kv_transfer_params_is_a_clear_error(graph: dict[str, Any]) -> None:
    ours = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 9, "bootstrap_room": 7}  # not vLLM's handoff
    wrong = {**GREEDY, "prefill_result": {"disaggregated_params": ours}}
    with pytest.raises(
        RequestError,
        match=r"needs prefill_result.disaggregated_params.kv_transfer_params.*"
        r"carries disaggregated_params with \['bootstrap_host', 'bootstrap_port', 'bootstrap_room'\]",
    ):
        await collect(graph["client"].round_robin(wrong))
    malformed = {**GREEDY, "prefill_result": {"disaggregated_params": {"bootstrap_room": 7}}}
    with pytest.raises(RequestError, match=r"disaggregated_params lacks bootstrap_host, bootstrap_port"):
        await collect(graph["client"].round_robin(malformed))  # refused where the request is read


async def test_model_cards_carry_vllms_block_size_and_no_bootstrap_endpoint(graph: dict[str, Any]) -> None:
    watch = await graph["runtime"].discovery.watch_prefix(CARD_PREFIX)
    cards = [ModelCard.from_json(value) for value in watch.items.values()]
    decode = [card for card in cards if "decode" in card.kinds]
    prefill = [card for card in cards if "prefill" in card.kinds]
    assert decode and decode[0].kv_cache_block_size == 32 and decode[0].context_length == 1024
    # vLLM's prefill has no bootstrap server of ours: the frontend takes the fallback path
    assert prefill and prefill[0].runtime_config.disaggregated_endpoint is None


async def test_vllm_kv_events_reach_a_kv_router(graph: dict[str, Any]) -> None:
    """A prompt of new blocks: vLLM's stored events (vLLM → ZMQ → our relay → NATS) put its three
    full blocks under the decode worker in a KV router's tree. A fresh prompt is tried again
    (at most three, 15 s each) when none came, so a subscription still settling on a busy host
    does not decide it; each miss is reported."""
    component = graph["runtime"].namespace("dynamo").component("backend")
    indexer = await KvIndexer.start(component)
    decode_id = int(parse_ready_line(graph["decode"].ready_line)[1]["instance"], 16)
    misses: list[str] = []
    try:
        for attempt in range(3):
            prompt = list(range(200 + 100 * attempt, 300 + 100 * attempt))  # new blocks: stored events follow
            await collect(
                graph["client"].round_robin(
                    {**GREEDY, "token_ids": prompt, "extra_args": {"aggregated": True}}
                )
            )
            wanted = block_hashes(prompt, 32)
            for _ in range(150):
                if indexer.tree.find_matches(wanted).scores.get(decode_id, 0) >= 3:
                    break
                await asyncio.sleep(0.1)
            matched = indexer.tree.find_matches(wanted).scores.get(decode_id)
            if matched == 3:
                break
            misses.append(f"attempt {attempt + 1}: {matched} blocks, events applied {dict(indexer._last)}")
        assert matched == 3, misses
    finally:
        await indexer.stop()


async def test_a_stopped_vllm_worker_exits_cleanly(graph: dict[str, Any]) -> None:
    """SIGTERM: the worker shuts vLLM down, exits 0, and its log ends without a traceback (vLLM's
    own ``AsyncLLM.__del__`` used to print a TypeError at interpreter exit)."""
    assert await graph["prefill"].stop(timeout=30) == 0
    log = graph["prefill"].log_path.read_text()
    assert "Traceback" not in log and "Exception ignored" not in log, log[-2000:]


async def test_a_sigkilled_vllm_worker_fails_the_stream_not_hangs(graph: dict[str, Any]) -> None:
    """Runs last: it kills the decode worker mid-stream (the prefill worker is stopped already)."""
    long = {
        **GREEDY,
        "stop_conditions": {"max_tokens": 900, "ignore_eos": True},
        "extra_args": {"aggregated": True},
    }
    stream = graph["client"].round_robin(long)
    first = await asyncio.wait_for(anext(stream), 60)
    assert first["token_ids"]
    graph["decode"].send_signal(signal.SIGKILL)
    with pytest.raises(RequestError):  # the worker's connection closed: an error, not a hang (30 s cap)
        await asyncio.wait_for(collect(stream), 30)


def test_help_lists_our_flags_and_vllms_own() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(VLLM_WORKER), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for flag in (
        "--discovery",
        "--model-path",
        "--mode",
        "--max-model-len",
        "--block-size",
        "--kv-transfer-config",
    ):
        assert flag in done.stdout, flag
    from dynamo_nb.flags import vllm_worker_parser

    args = vllm_worker_parser().parse_args(["--mode", "decode", "--max-model-len", "512"])
    assert (args.mode, args.max_model_len, args.block_size) == ("decode", 512, 32)  # 32: vLLM's CPU attention


def test_the_flags_declared_for_hosts_without_vllm_are_vllms_own() -> None:
    """`VLLM_FLAGS` (what graphs are checked against where vLLM is missing) parse as vLLM's
    own parser parses them: the same destination, and the same value for a typed flag."""
    import argparse

    from dynamo_nb.flags import VLLM_FLAGS, vllm_worker_parser

    real = {option: action for action in vllm_worker_parser()._actions for option in action.option_strings}
    declared = argparse.ArgumentParser()
    for flag, options in VLLM_FLAGS:
        declared.add_argument(flag, **options)  # type: ignore[arg-type]
    samples = {int: "7", float: "0.5"}
    for flag, options in VLLM_FLAGS:
        assert flag in real, f"{flag} is not one of vLLM's flags"
        dest = declared._option_string_actions[flag].dest
        assert real[flag].dest == dest, flag
        if options.get("action") == "store_true":
            argv = [flag]
        elif options.get("type") in samples:
            argv = [flag, samples[options["type"]]]  # type: ignore[index]
        else:
            continue  # a string vLLM parses further (JSON into a config object)
        ours = getattr(declared.parse_args(argv), dest)
        theirs = getattr(vllm_worker_parser().parse_args(argv), dest)
        assert ours == theirs, (flag, ours, theirs)
