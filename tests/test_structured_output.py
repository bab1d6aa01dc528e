"""Structured output on the hf engine, through the frontend: ``response_format`` (json_object,
json_schema) and ``nvext.structured_outputs`` (json, regex, choice, grammar) enforced by
llguidance's grammar token by token, with the real tiny model.

What is checked: 100 generated JSON schemas, each with two seeds at temperature 1, every
output validates with ``jsonschema``; regex, choice and Lark grammar outputs match; the openai
SDK's ``beta.chat.completions.parse`` fills a Pydantic model; a streamed answer is the
unstreamed one; constrained requests run in the same batch as unconstrained ones without
changing them; a ``json_object`` answer that ends is one object (chat and Responses API); a
schema that does not compile, two ways of asking at once, a model whose workers do not enforce
grammars and a pair whose prefill worker does not are 400s naming the field; a stream continued on another worker
replays its grammar's state.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import pytest
from helpers import random_schema

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines import EchoEngine
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.hf import HFEngine
from dynamo_nb.engines.hf_grammar import Grammars
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm.guided import GuidedDecoding
from dynamo_nb.models import tiny_model_path

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
async def frontend() -> AsyncIterator[Frontend]:
    """The hf engine (tiny model) serving ``tiny-llama`` and an echo engine serving ``echo``,
    behind one frontend, in this process."""
    async with await DistributedRuntime.create() as runtime:
        engine = await HFEngine.load(tiny_model_path())
        await serve_engine(runtime, WorkerRole(), tiny_model_path(), MODEL, lambda kv_events: engine)
        echo = EchoEngine()
        await serve_engine(runtime, WorkerRole(endpoint="dynamo.echo.generate"), tiny_model_path(), "echo",
                           lambda kv_events: echo)  # fmt: skip
        front = await Frontend.start(runtime, port=0)
        await front.wait_for_model(MODEL)
        await front.wait_for_model("echo")
        yield front
        await front.stop()
        await engine.close()


async def post(frontend: Frontend, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=frontend.url, timeout=120) as http:
        return await http.post(path, json=body)


async def test_a_hundred_generated_schemas_each_output_validates(frontend: Frontend) -> None:
    draw = random.Random(2024)
    for index in range(100):
        schema = random_schema(draw)
        for seed in (index, 1000 + index):  # two samples of each schema
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Answer in JSON ({index})"}],
                    "max_tokens": 200, "temperature": 1.0, "seed": seed,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}  # fmt: skip
            answer = await post(frontend, "/v1/chat/completions", body)
            assert answer.status_code == 200, answer.text
            choice = answer.json()["choices"][0]
            assert choice["finish_reason"] == "stop", (schema, choice)
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)


@pytest.mark.parametrize(
    ("asked", "holds"),
    [
        ({"regex": "[a-z]{3}-[0-9]{2}"}, lambda text: re.fullmatch("[a-z]{3}-[0-9]{2}", text)),
        ({"choice": ["yes", "no", "maybe"]}, lambda text: text in ("yes", "no", "maybe")),
        ({"grammar": 'start: "x" ("y")* "z"'}, lambda text: re.fullmatch("xy*z", text)),
        ({"json": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
         lambda text: isinstance(json.loads(text), list)),
    ],
)  # fmt: skip
async def test_vllms_structured_outputs_under_nvext_are_enforced(
    frontend: Frontend, asked: dict[str, Any], holds: Any
) -> None:
    for seed in range(3):
        body = {"model": MODEL, "prompt": "Say something", "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "nvext": {"structured_outputs": asked}}  # fmt: skip
        answer = await post(frontend, "/v1/completions", body)
        assert answer.status_code == 200, answer.text
        text = answer.json()["choices"][0]["text"]
        assert holds(text), text


async def test_the_openai_sdk_parses_the_answer_into_a_pydantic_model(frontend: Frontend) -> None:
    import openai
    import pydantic

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        age: int = pydantic.Field(ge=0, le=120)

    client = openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key="none")
    completion = await client.beta.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "A person"}], response_format=Person,
        max_tokens=60, temperature=0,
    )  # fmt: skip
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120
    await client.close()


async def test_a_streamed_answer_is_the_unstreamed_one(frontend: Frontend) -> None:
    body = {"model": MODEL, "prompt": "JSON please", "max_tokens": 80, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
                "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
                "required": ["a", "b"], "additionalProperties": False}}}}  # fmt: skip
    whole = (await post(frontend, "/v1/completions", body)).json()["choices"][0]["text"]
    pieces = []
    async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: {"):
                    pieces += [choice["text"] for choice in json.loads(line[6:])["choices"]]
    assert "".join(pieces) == whole and json.loads(whole)["a"] is not None


async def test_constrained_rows_share_a_batch_without_changing_the_others(frontend: Frontend) -> None:
    plain = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    alone = (await post(frontend, "/v1/completions", plain)).json()["choices"][0]["text"]
    guided = {**plain, "prompt": "Pick one", "nvext": {"structured_outputs": {"regex": "[0-9]{20}"}}}
    answers = await asyncio.gather(*[post(frontend, "/v1/completions", body) for body in [plain, guided] * 4])
    texts = [answer.json()["choices"][0]["text"] for answer in answers]
    assert texts[0::2] == [alone] * 4
    assert all(re.fullmatch("[0-9]{20}", text) for text in texts[1::2]), texts


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "nonsense"}}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"nvext": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, "nvext.structured_outputs"),
        ({"nvext": {"structured_outputs": {"choice": []}}}, "nvext.structured_outputs.choice"),
        ({"response_format": {"type": "json_object"}, "nvext": {"structured_outputs": {"regex": "a"}}},
         "response_format"),
        ({"model": "echo", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)  # fmt: skip
async def test_what_cannot_be_enforced_is_a_400_naming_the_field(
    frontend: Frontend, body: dict[str, Any], param: str
) -> None:
    answer = await post(
        frontend, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4, **body}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()


async def test_json_object_answers_parse_as_json_objects(frontend: Frontend) -> None:
    """``{"type": "json_object"}`` on the chat route and as the Responses API's ``text.format``:
    an answer that ends is one JSON object, greedy or sampled (a sampled one may instead run to
    ``max_tokens`` inside a long string, as on any engine: the grammar bounds no length)."""
    ended = 0
    for seed, temperature in [(0, 0.0)] + [(seed, 1.0) for seed in range(8)]:
        chat = await post(frontend, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "Describe a ship in JSON"}], "max_tokens": 300,
            "temperature": temperature, "seed": seed, "response_format": {"type": "json_object"}})  # fmt: skip
        assert chat.status_code == 200, chat.text
        choice = chat.json()["choices"][0]
        content = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(content), dict), choice
            ended += 1
        else:
            assert choice["finish_reason"] == "length" and content.startswith("{"), choice
    assert ended >= 2, "greedy and at least one sampled answer end"
    answer = await post(frontend, "/v1/responses", {
        "model": MODEL, "input": "Describe a ship in JSON", "max_output_tokens": 300, "temperature": 0,
        "text": {"format": {"type": "json_object"}}})  # fmt: skip
    assert answer.status_code == 200, answer.text
    (message,) = [item for item in answer.json()["output"] if item["type"] == "message"]
    assert isinstance(json.loads(message["content"][0]["text"]), dict), message


async def test_a_prefill_worker_that_does_not_enforce_grammars_is_a_400_naming_the_field() -> None:
    """A pair whose decode (hf) enforces grammars but whose prefill (the mocker) does not: its
    first token would be unconstrained, so structured output is refused, naming the field."""
    from dynamo_nb.disagg.modes import DEFAULT_PREFILL_ENDPOINT
    from dynamo_nb.engines.mocker import MockerEngine

    async with await DistributedRuntime.create() as runtime:
        decode = await HFEngine.load(tiny_model_path())
        prefill = MockerEngine(speedup_ratio=100.0)
        await serve_engine(runtime, WorkerRole(mode="prefill", endpoint=DEFAULT_PREFILL_ENDPOINT),
                           tiny_model_path(), MODEL, lambda kv_events: prefill)  # fmt: skip
        await serve_engine(
            runtime, WorkerRole(mode="decode"), tiny_model_path(), MODEL, lambda kv_events: decode
        )
        front = await Frontend.start(runtime, port=0)
        try:
            await front.wait_for_model(MODEL)
            for _ in range(200):
                if front.models.prefill_planner(MODEL) is not None:
                    break
                await asyncio.sleep(0.05)
            answer = await post(front, "/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "response_format": {"type": "json_object"}})  # fmt: skip
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "response_format" and "prefill worker" in error["message"], error
        finally:
            await front.stop()
            await decode.close()
            await prefill.close()


def test_a_continued_stream_replays_its_grammars_state() -> None:
    """A stream that moves to another worker carries the tokens made so far in its prompt and
    ``generated``: the new matcher starts past them, and forbids what the grammar no longer allows."""
    from dynamo_nb.llm import ModelTokenizer, PreprocessedRequest

    tokenizer = ModelTokenizer.load(tiny_model_path())
    grammars = Grammars.from_folder(tiny_model_path(), vocab_rows=tokenizer.vocab_size, eos_token_ids=[2])
    guided = GuidedDecoding("regex", "ab+c", "nvext.structured_outputs.regex")
    made = tokenizer.encode("ab", add_special_tokens=False)
    request = PreprocessedRequest([1, 5, 6], guided_decoding=guided).continued(made)
    assert request.guided_decoding is not None and request.guided_decoding.generated == len(made)
    again = PreprocessedRequest.from_dict(request.to_dict())  # as the next worker reads it
    matcher = grammars.matcher(again.guided_decoding, again.token_ids)  # type: ignore[arg-type]
    import torch

    row = torch.zeros(tokenizer.vocab_size)
    matcher.mask(row)
    allowed = {
        tokenizer.decode([i], skip_special_tokens=False) for i in torch.nonzero(row == 0).flatten().tolist()
    }
    assert allowed and all(set(text) <= set("bc") for text in allowed), sorted(allowed)[:10]
