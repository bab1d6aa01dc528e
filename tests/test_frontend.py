"""The OpenAI frontend in one process (memory discovery, inproc plane) with the real tiny model."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers import collect, metric_value, req

from dynamo_nb import DistributedRuntime
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.frontend.app import MAX_BODY_BYTES
from dynamo_nb.llm import ModelTokenizer, serve_llm
from dynamo_nb.llm.detokenize import StreamDetokenizer
from dynamo_nb.llm.protocol import LLMEngineOutput

MODEL = "tiny"
HI = [{"role": "user", "content": "Hello! How are you today?"}]


class Served:
    def __init__(
        self, runtime: DistributedRuntime, frontend: Frontend, engine: Any, tokenizer: ModelTokenizer
    ):
        self.runtime = runtime
        self.frontend = frontend
        self.engine = engine
        self.tokenizer = tokenizer
        self.http = httpx.AsyncClient(base_url=frontend.url, timeout=30)
        self.openai = openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
async def served(hf_engine: Any, tiny_path: Path) -> AsyncIterator[Served]:
    runtime = await DistributedRuntime.create()
    await serve_llm(runtime.endpoint("fe.backend.generate"), hf_engine.generate, tiny_path, model_name=MODEL)
    frontend = await Frontend.start(runtime, port=0)
    await frontend.wait_for_model(MODEL, timeout=10)
    s = Served(runtime, frontend, hf_engine, ModelTokenizer.load(tiny_path))
    yield s
    await s.http.aclose()
    await s.openai.close()
    await frontend.stop()
    await runtime.shutdown()


async def direct_text(s: Served, token_ids: list[int], max_tokens: int) -> tuple[str, list[int]]:
    """What the engine generates for ``token_ids`` when asked straight, greedy."""
    items = await collect(
        s.engine.generate(
            req(
                {
                    "token_ids": token_ids,
                    "stop_conditions": {"max_tokens": max_tokens},
                    "sampling_options": {"temperature": 0},
                    "eos_token_ids": [2, 0],
                }
            )
        )
    )
    tokens = [t for item in items for t in item["token_ids"]]
    return s.tokenizer.decode(tokens), tokens


async def engine_idle(engine: Any, timeout: float = 5.0) -> bool:
    """Whether the engine drops every sequence within ``timeout`` (cancellation is asynchronous)."""
    for _ in range(int(timeout / 0.02)):
        if engine.active == 0:
            return True
        await asyncio.sleep(0.02)
    return engine.active == 0


def chat_token_ids(s: Served, messages: list[dict[str, str]]) -> list[int]:
    return s.tokenizer.encode(s.tokenizer.render_chat(messages), add_special_tokens=False)


async def test_openai_client_chat_unary_and_stream_equal_the_engine_output(served: Served) -> None:
    expected, tokens = await direct_text(served, chat_token_ids(served, HI), 24)
    reply = await served.openai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=24, temperature=0
    )
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens == len(tokens)
    assert reply.usage.prompt_tokens == len(chat_token_ids(served, HI))
    assert reply.choices[0].finish_reason == ("length" if len(tokens) == 24 else "stop")
    stream = await served.openai.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
    assert chunks[-2].choices[0].finish_reason == reply.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1


async def test_openai_client_completions_unary_and_stream(served: Served) -> None:
    prompt = "Once upon a time a small robot"
    expected, _ = await direct_text(served, served.tokenizer.encode(prompt), 12)
    reply = await served.openai.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert reply.choices[0].text == expected and reply.object == "text_completion"
    stream = await served.openai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream]) == expected
    default = await served.openai.completions.create(
        model=MODEL, prompt=prompt, temperature=0, extra_body={"ignore_eos": True}
    )
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions
    by_ids = await served.openai.completions.create(
        model=MODEL, prompt=served.tokenizer.encode(prompt), max_tokens=12, temperature=0
    )
    assert by_ids.choices[0].text == expected


async def test_return_token_ids_gives_vllms_fields_streamed_and_unary(served: Served) -> None:
    """vLLM's ``return_token_ids``: the choice carries the prompt's ids and the generated ones;
    streamed, each chunk the ids since the last (an upstream worker reads them back)."""
    prompt = served.tokenizer.encode("Once upon a time a small robot")
    _, tokens = await direct_text(served, prompt, 10)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    whole = (await served.http.post("/v1/completions", json=body)).json()["choices"][0]
    assert (whole["prompt_token_ids"], whole["token_ids"]) == (prompt, tokens)
    for kind, extra in (("completions", {}), ("chat/completions", {"messages": HI, "prompt": None})):
        streamed = {**body, **extra, "stream": True}
        streamed = {k: v for k, v in streamed.items() if v is not None}
        async with served.http.stream("POST", f"/v1/{kind}", json=streamed) as answer:
            chunks = [
                json.loads(line[6:]) async for line in answer.aiter_lines() if line.startswith("data: {")
            ]
        choices = [chunk["choices"][0] for chunk in chunks]
        assert "prompt_token_ids" in choices[0] and all("prompt_token_ids" not in c for c in choices[1:])
        ids = [token for choice in choices for token in choice["token_ids"]]
        expected = (
            tokens
            if kind == "completions"
            else (await direct_text(served, chat_token_ids(served, HI), 10))[1]
        )
        assert ids == expected, kind
    plain = (await served.http.post("/v1/completions", json={**body, "return_token_ids": False})).json()
    assert "token_ids" not in plain["choices"][0]  # only when asked


async def test_stop_strings_end_the_text_and_the_worker_stream(served: Served) -> None:
    expected, _ = await direct_text(served, chat_token_ids(served, HI), 30)
    stop = expected[8:11]
    cut = expected[: expected.index(stop)]
    reply = await served.openai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=30, temperature=0, stop=[stop]
    )
    assert reply.choices[0].message.content == cut and reply.choices[0].finish_reason == "stop"
    stream = await served.openai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == cut
    assert await engine_idle(served.engine)


async def test_seeded_sampling_through_the_frontend_is_reproducible(served: Served) -> None:
    async def ask(seed: int) -> str:
        reply = await served.openai.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=16, seed=seed, temperature=1.0, top_p=0.9
        )
        return reply.choices[0].message.content or ""

    assert await ask(7) == await ask(7)


CHAT = "/v1/chat/completions"
GOOD = {"model": MODEL, "messages": HI, "max_tokens": 4}


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "says"),
    [
        (CHAT, b"{not json", 400, None, "not valid JSON"),
        (CHAT, b"[1, 2]", 400, None, "JSON object"),
        (CHAT, {"messages": HI}, 400, "model", "model is required"),
        (CHAT, {"model": MODEL}, 400, "messages", "messages"),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages[0].role",
            "role",
        ),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages[0].content",
            "text",
        ),
        (CHAT, {"model": MODEL, "messages": [{"role": "user"}]}, 400, "messages[0].content", "required"),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "tool", "content": "42"}]},
            400,
            "messages[0].tool_call_id",
            "tool_call_id",
        ),
        (
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": "x", "name": 3}]},
            400,
            "messages[0].name",
            "string",
        ),
        (CHAT, {**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
        (CHAT, {**GOOD, "min_tokens": 9}, 400, "min_tokens", "more than max_tokens"),
        (CHAT, {**GOOD, "seed": 2**64}, 400, "seed", "between"),
        (CHAT, {**GOOD, "n": True}, 400, "n", "n=1"),
        (CHAT, {**GOOD, "logit_bias": {"5": 10}}, 400, "logit_bias", "not supported"),
        (CHAT, {**GOOD, "user": 7}, 400, "user", "string"),
        (CHAT, b"[" * 30_000 + b"]" * 30_000, 400, None, "nested too deeply"),
        (CHAT, b"[" * 100_000 + b"]" * 100_000, 400, None, "bytes to decode"),
        (CHAT, b"[" + b"[]," * 100_000 + b"[]]", 400, None, "bytes to decode"),
        (CHAT, {**GOOD, "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        (CHAT, {**GOOD, "max_tokens": "many"}, 400, "max_tokens", "integer"),
        (CHAT, {**GOOD, "max_tokens": 5000}, 400, "max_tokens", "lower max_tokens"),
        (CHAT, {**GOOD, "temperature": 9}, 400, "temperature", "between 0 and 2"),
        (CHAT, {**GOOD, "top_p": -1}, 400, "top_p", "between"),
        (CHAT, {**GOOD, "top_k": 0}, 400, "top_k", "top_k"),
        (CHAT, {**GOOD, "n": 2}, 400, "n", "n=1"),
        (CHAT, {**GOOD, "stop": 5}, 400, "stop", "stop"),
        (CHAT, {**GOOD, "stream": "yes"}, 400, "stream", "true or false"),
        (CHAT, {**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream=true"),
        (CHAT, {**GOOD, "logprobs": True}, 400, "logprobs", "not supported"),
        (CHAT, {**GOOD, "presence_penalty": 1.0}, 400, "presence_penalty", "not supported"),
        (
            CHAT,
            {**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]},
            400,
            "tools",
            "--tool-call-parser",
        ),
        (CHAT, {**GOOD, "nvext": "worker_id"}, 400, "nvext", "must be an object"),
        (CHAT, {**GOOD, "nvext": {"extra_fields": "worker_id"}}, 400, "nvext.extra_fields", "list of names"),
        (
            CHAT,
            {**GOOD, "messages": [{"role": "user", "content": "word " * 1200}]},
            400,
            "messages",
            "context",
        ),
        # a body larger than any served context could take is refused before it is decoded
        # (10 MB of short words would hold the event loop for seconds and a gigabyte)
        (
            CHAT,
            {**GOOD, "messages": [{"role": "user", "content": "a b " * 2_500_000}]},
            400,
            "messages",
            "more than a prompt that fits",
        ),
        # a text that cannot fit however it tokenizes is refused before it is tokenized
        (
            CHAT,
            {**GOOD, "messages": [{"role": "user", "content": "a b " * 200_000}]},
            400,
            "messages",
            "characters, at least",
        ),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "word " * 200_000},
            400,
            "prompt",
            "characters, at least",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt", "empty"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
        ("/v1/completions", {"model": MODEL, "prompt": [1, 99999]}, 400, "prompt", "vocabulary"),
        # text JSON allows but Unicode does not (a lone surrogate), escaped or as raw bytes, in
        # both APIs, streamed or not: a 400 naming the field, never a 500 from the tokenizer
        (
            CHAT,
            {**GOOD, "messages": [{"role": "user", "content": "hi \ud800"}]},
            400,
            "messages[0].content",
            "lone surrogate",
        ),
        (
            CHAT,
            {**GOOD, "stream": True, "messages": [{"role": "user", "content": "\udfff"}]},
            400,
            "messages[0].content",
            "lone surrogate",
        ),
        (
            CHAT,
            b'{"model": "tiny", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
            400,
            "messages[0].content",
            "lone surrogate",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "\ud800"}, 400, "prompt", "lone surrogate"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "stream": True, "stop": ["\udc80"]},
            400,
            "stop[0]",
            "lone surrogate",
        ),
        (CHAT, {**GOOD, "model": "nope"}, 404, "model", "not found"),
        ("/v1/nothing", GOOD, 404, None, "no route"),
    ],
)
async def test_bad_input_gets_an_openai_error_envelope(
    served: Served, path: str, body: Any, status: int, param: str | None, says: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await served.http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and says in error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    ok = await served.http.post(CHAT, json=GOOD)  # and the server keeps serving
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


async def test_a_long_prompt_is_refused_after_tokenizing_only_its_head(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt the characters-per-token floor cannot refuse, but whose first 8 × context
    characters alone overflow the context: refused after tokenizing those, not all of it."""
    model = served.frontend.models.get(MODEL)
    assert model is not None and model.card.context_length == 1024
    seen: list[int] = []
    encode = model.tokenizer.encode
    monkeypatch.setattr(
        model.tokenizer, "encode", lambda text, **kw: seen.append(len(text)) or encode(text, **kw)
    )
    prompt = "word " * 6000  # 30,000 characters: under the floor's 34 a token, about 6,000 tokens
    assert model.tokenizer.fewest_tokens(prompt) < 1024
    response = await served.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert response.status_code == 400, response.text
    assert "its first 8192 alone are" in response.json()["error"]["message"]
    assert seen == [8 * 1024]  # the head only
    seen.clear()
    fits = {"model": MODEL, "prompt": "word " * 100, "max_tokens": 2}
    assert (await served.http.post("/v1/completions", json=fits)).status_code == 200
    assert seen == [len("word " * 100)]  # a prompt under the head's length: tokenized once


async def test_text_beyond_the_bmp_is_served(served: Served) -> None:
    content = json.dumps({**GOOD, "messages": [{"role": "user", "content": "hi \U0001f600"}]})
    assert "\\ud83d\\ude00" in content  # escaped as a surrogate pair, as json.dumps does
    response = await served.http.post(CHAT, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text


async def test_openai_client_raises_its_own_error_types(served: Served) -> None:
    with pytest.raises(openai.NotFoundError):
        await served.openai.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        await served.openai.chat.completions.create(model=MODEL, messages=HI, temperature=5)


async def test_wrong_method_and_completions_only_models(served: Served, tiny_path: Path) -> None:
    response = await served.http.get(CHAT)
    assert response.status_code == 405 and "not allowed" in response.json()["error"]["message"]
    too_big = await served.http.post(CHAT, content=b" " * (MAX_BODY_BYTES + 1))
    assert too_big.status_code == 413 and "larger than" in too_big.json()["error"]["message"]
    echo = EchoEngine()
    server, _ = await serve_llm(
        served.runtime.endpoint("fe.echo.generate"),
        echo.generate,
        tiny_path,
        model_name="echo-only",
        kind="completions",
    )
    await served.frontend.wait_for_model("echo-only", timeout=5)
    response = await served.http.post(CHAT, json={**GOOD, "model": "echo-only"})
    assert response.status_code == 400 and "/v1/completions" in response.json()["error"]["message"]
    await server.stop()


async def test_models_health_live_and_metrics(served: Served) -> None:
    models = (await served.http.get("/v1/models")).json()
    assert models["object"] == "list" and MODEL in [m["id"] for m in models["data"]]
    health = await served.http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "healthy"
    assert any(
        i["model"] == MODEL and i["endpoint"] == "fe.backend.generate" for i in health.json()["instances"]
    )
    assert (await served.http.get("/live")).json() == {"status": "live"}
    await served.http.post(CHAT, json={**GOOD, "stream": True})
    metrics = (await served.http.get("/metrics")).text
    stream_success = {"endpoint": "chat_completions", "request_type": "stream", "status": "success"}
    assert metric_value(metrics, "dynamo_frontend_requests_total", model="tiny", **stream_success) >= 1
    assert metric_value(metrics, "dynamo_frontend_inflight_requests", model="tiny") == 0
    assert metric_value(metrics, "dynamo_frontend_time_to_first_token_seconds_count", model="tiny") >= 1
    assert metric_value(
        metrics, "dynamo_frontend_inter_token_latency_seconds_bucket", model="tiny", le="+Inf"
    )


async def test_every_gap_between_tokens_is_observed_whether_it_waited_or_not(
    served: Served, tiny_path: Path
) -> None:
    """One inter-token gap per token after the first: tokens that came in a burst (gap 0,
    counted together at the stream's end) and tokens waited for alike."""

    async def in_bursts(request: Any, context: Any = None) -> AsyncIterator[LLMEngineOutput]:
        prompt = request.token_ids
        for index in range(39):  # ten at a time, the stream's queue holding the rest of each ten
            yield LLMEngineOutput([prompt[index % len(prompt)]])
            if index % 10 == 9:
                await asyncio.sleep(0.01)
        yield LLMEngineOutput.final([prompt[0]], "length", prompt_tokens=len(prompt), completion_tokens=40)

    endpoint = served.runtime.endpoint("fe.gaps.generate")
    server, _ = await serve_llm(endpoint, in_bursts, tiny_path, model_name="gaps")
    await served.frontend.wait_for_model("gaps", timeout=5)
    itl = "dynamo_frontend_inter_token_latency_seconds_count"
    before = metric_value((await served.http.get("/metrics")).text, itl, model="gaps") or 0
    body = {**GOOD, "model": "gaps", "max_tokens": 40, "ignore_eos": True, "stream": True}
    for _ in range(3):
        async with served.http.stream("POST", CHAT, json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
    after = metric_value((await served.http.get("/metrics")).text, itl, model="gaps")
    assert after - before == 3 * 39
    await server.stop()


async def test_a_client_that_disconnects_cancels_the_worker_request(served: Served) -> None:
    body = {**GOOD, "max_tokens": 900, "ignore_eos": True, "stream": True}
    async with served.http.stream("POST", CHAT, json=body) as response:
        lines = response.aiter_lines()
        assert (await lines.__anext__()).startswith("data: ")
        assert served.engine.active == 1
    assert await engine_idle(served.engine)  # the frontend notices at its next write
    metrics = (await served.http.get("/metrics")).text
    cancelled = {"request_type": "stream", "status": "cancelled"}
    assert metric_value(metrics, "dynamo_frontend_requests_total", model="tiny", **cancelled) == 1


async def test_no_workers_gives_503_and_a_returning_worker_is_served(served: Served, tiny_path: Path) -> None:
    echo = EchoEngine()
    endpoint = served.runtime.endpoint("fe.gone.generate")
    server, _ = await serve_llm(endpoint, echo.generate, tiny_path, model_name="gone")
    await served.frontend.wait_for_model("gone", timeout=5)
    assert (await served.http.post(CHAT, json={**GOOD, "model": "gone"})).status_code == 200
    await server.stop()
    response = await served.http.post(CHAT, json={**GOOD, "model": "gone"})
    assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable_error"
    assert "gone" not in [m["id"] for m in (await served.http.get("/v1/models")).json()["data"]]
    server, _ = await serve_llm(endpoint, echo.generate, tiny_path, model_name="gone")
    await served.frontend.wait_for_model("gone", timeout=5)
    assert (await served.http.post(CHAT, json={**GOOD, "model": "gone"})).status_code == 200
    await server.stop()


async def test_direct_routing_by_backend_instance_id(served: Served, tiny_path: Path) -> None:
    """``nvext.backend_instance_id`` sends a request to that worker, whatever the router's turn."""
    second_rt = await DistributedRuntime.create()
    try:
        await serve_llm(
            second_rt.endpoint("fe.backend.generate"), EchoEngine().generate, tiny_path, model_name=MODEL
        )
        model = await served.frontend.wait_for_model(MODEL)
        for _ in range(100):
            if len(model.client.instance_ids()) == 2:
                break
            await asyncio.sleep(0.02)
        ids = model.client.instance_ids()
        assert len(ids) == 2
        for instance_id, given in [(i, i) for i in ids] + [
            (i, f"{i:x}") for i in ids
        ]:  # int, or hex as /health shows
            body = {**GOOD, "nvext": {"backend_instance_id": given, "extra_fields": ["worker_id"]}}
            response = await served.http.post(CHAT, json=body)
            assert response.status_code == 200, response.text
            assert response.json()["nvext"]["worker_id"]["decode_worker_id"] == instance_id
        missing = await served.http.post(CHAT, json={**GOOD, "nvext": {"backend_instance_id": 12345}})
        assert missing.status_code == 503 and "does not serve" in missing.json()["error"]["message"]
        bad = await served.http.post(CHAT, json={**GOOD, "nvext": {"backend_instance_id": "x"}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "nvext.backend_instance_id"
        assert "hex" in bad.json()["error"]["message"] and "integer" in bad.json()["error"]["message"]
    finally:
        await second_rt.shutdown()


async def test_two_models_on_one_endpoint_path_each_reach_only_their_own_workers(tiny_path: Path) -> None:
    """Workers of two models that serve the same endpoint path (two programs left at their default
    ``--endpoint``): each model's requests go only to the instances whose card names it."""
    runtimes = [await DistributedRuntime.create() for _ in range(3)]
    try:
        servers = {}
        for runtime, name in zip(runtimes[1:], ("first", "second"), strict=True):
            server, _ = await serve_llm(
                runtime.endpoint("shared.backend.generate"), EchoEngine().generate, tiny_path, model_name=name
            )
            servers[name] = server.instance_id
        frontend = await Frontend.start(runtimes[0], port=0)
        try:
            for name in servers:
                await frontend.wait_for_model(name, timeout=10)
            async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
                for name, instance_id in [*servers.items()] * 3:
                    body = {
                        "model": name,
                        "prompt": [5, 6],
                        "max_tokens": 1,
                        "nvext": {"extra_fields": ["worker_id"]},
                    }
                    answer = await http.post("/v1/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["nvext"]["worker_id"]["decode_worker_id"] == instance_id, name
        finally:
            await frontend.stop()
    finally:
        for runtime in runtimes:
            await runtime.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_nvext_timing_says_when_the_request_arrived_waited_and_answered(
    served: Served, stream: bool
) -> None:
    """``nvext.extra_fields: ["timing"]``, as Dynamo's: arrival, the wait to be let in, the prefill,
    TTFT and the total, consistent with each other and with the client's clock; and the answer's
    id and ``x-request-id`` header name the request, a client's own id when it sends one."""
    before = time.time() * 1000
    body = {**GOOD, "stream": stream, "nvext": {"extra_fields": ["timing"]}}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = await served.http.post(CHAT, json=body, headers={"x-request-id": f"mine-{stream}"})
    after = time.time() * 1000
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == f"mine-{stream}"
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        answer = next(event for event in events if "nvext" in event)
        usage = next(event for event in events if event.get("usage"))["usage"]
    else:
        answer = response.json()
        usage = answer["usage"]
    assert answer["id"] == f"chatcmpl-mine-{stream}"
    timing = answer["nvext"]["timing"]
    assert before - 1 <= timing["request_received_ms"] <= after
    assert (
        0
        <= timing["prefill_wait_time_ms"]
        <= timing["ttft_ms"]
        <= timing["total_time_ms"]
        <= after - before + 1
    )
    assert timing["prefill_time_ms"] == pytest.approx(
        timing["ttft_ms"] - timing["prefill_wait_time_ms"], abs=0.01
    )
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert timing["kv_hit_rate"] == pytest.approx(
        cached / usage["prompt_tokens"], abs=1e-4
    )  # what the engine reused
    bad = await served.http.post(CHAT, json=GOOD, headers={"x-request-id": "has space"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-request-id"


class BurstEngine(EchoEngine):
    """The echo engine with every item ready at once (a worker far ahead of its frontend)."""

    async def generate(self, request: Any, context: Any = None) -> Any:
        outputs = [output async for output in super().generate(request, context)]
        for output in outputs:
            yield output


def dechunk(raw: bytes) -> tuple[bytes, int]:
    """The body of a chunked HTTP/1.1 response (headers included in ``raw``), and its chunk count."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body, chunks = b"", 0
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body, chunks
        body, rest, chunks = body + rest[:size], rest[size + 2 :], chunks + 1


async def raw_stream(
    url: str, model: str, max_tokens: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed chat request on a raw socket (to see the HTTP chunks as the server wrote them)."""
    body = json.dumps({"model": model, "messages": HI, "max_tokens": max_tokens, "stream": True}).encode()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    return reader, writer


async def test_a_short_stream_is_two_writes_and_the_role_chunk_does_not_wait(
    served: Served, tiny_path: Path
) -> None:
    """A one-token stream whose first item is its last goes out in one write and one HTTP
    chunk: the headers, role chunk, token, finish chunk and ``[DONE]`` with the body's end.
    When the first item has no text, the role chunk still leaves at once: the second item
    comes only after the client saw it."""
    text_id = served.tokenizer.encode("Hello", add_special_tokens=False)[0]
    piece = StreamDetokenizer(served.tokenizer, []).push(text_id)
    assert piece  # a token with text
    gate = asyncio.Event()

    async def quick(request: Any, context: Any = None) -> Any:
        yield LLMEngineOutput([text_id], "length")

    async def gated(request: Any, context: Any = None) -> Any:
        yield LLMEngineOutput([])  # nothing to show yet
        await gate.wait()
        yield LLMEngineOutput([text_id], "length")

    servers = [
        (await serve_llm(served.runtime.endpoint(f"fe.{name}.generate"), engine, tiny_path, model_name=name))[
            0
        ]
        for name, engine in (("quick", quick), ("gated", gated))
    ]
    try:
        await served.frontend.wait_for_model("quick", timeout=5)
        await served.frontend.wait_for_model("gated", timeout=5)
        reader, writer = await raw_stream(served.frontend.url, "quick", 1)
        raw = await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
        sse, chunks = dechunk(raw)
        events = [json.loads(e.removeprefix("data: ")) for e in sse.decode().split("\n\n")[:-2]]
        assert [e["choices"][0]["delta"] for e in events][:2] == [
            {"role": "assistant", "content": ""},
            {"content": piece},
        ]
        assert sse.endswith(b"data: [DONE]\n\n") and chunks == 1, (chunks, sse)  # 5 writes before

        reader, writer = await raw_stream(served.frontend.url, "gated", 1)
        seen = b""
        while b'"role":"assistant"' not in seen:  # the role chunk comes before the gate opens
            seen += await asyncio.wait_for(reader.read(4096), 10)
        gate.set()
        raw = seen + await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
        sse, chunks = dechunk(raw)
        assert sse.endswith(b"data: [DONE]\n\n") and chunks == 2, (
            chunks,
            sse,
        )  # the role chunk alone, then the rest
    finally:
        for server in servers:
            await server.stop()


async def test_ready_tokens_go_out_in_one_write_as_one_event_each(served: Served, tiny_path: Path) -> None:
    """Tokens already received when the writer gets to them are sent in one write (fewer
    syscalls and HTTP chunks per token); the client still sees one SSE event per token."""
    server, _ = await serve_llm(
        served.runtime.endpoint("fe.burst.generate"), BurstEngine().generate, tiny_path, model_name="burst"
    )
    try:
        await served.frontend.wait_for_model("burst", timeout=5)
        body = json.dumps({"model": "burst", "messages": HI, "max_tokens": 48, "stream": True}).encode()
        host, port = served.frontend.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        raw = await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
        sse, chunks = dechunk(raw)
        events = [line for line in sse.decode().split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        chunks_of = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
        deltas = [
            c["choices"][0]["delta"]
            for c in chunks_of
            if c["choices"] and c["choices"][0]["finish_reason"] is None
        ]
        assert deltas[0] == {"role": "assistant", "content": ""}
        pieces = [delta["content"] for delta in deltas[1:]]
        token_ids = chat_token_ids(served, HI)
        detok = StreamDetokenizer(served.tokenizer, [])
        expected = [detok.push(token_ids[i % len(token_ids)]) for i in range(48)]
        assert pieces == [piece for piece in expected if piece]  # one event per token that has text
        assert chunks < 10, chunks  # 48 ready tokens: a handful of writes, not 48
    finally:
        await server.stop()
