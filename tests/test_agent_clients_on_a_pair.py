"""Agent clients on an hf prefill/decode pair (two engines, the prompt's KV handed over by the
bootstrap server), checked with the official SDKs: structured output holds from the first token
(the prefill draws it under the request's grammar, the decode goes on from there: an
unconstrained first token would break the decode's grammar), a forced tool call validates on the
chat route streamed and whole, ``beta.chat.completions.parse`` fills a Pydantic model, and the
Responses and Messages APIs return their tool calls — each answer served by both workers of the
pair, chosen by the KV router (``nvext`` names them and the router's decisions on every API)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pytest
from helpers import hf_frontends, random_schema

from dynamo_nb.frontend import Frontend

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-llama"
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
TOOLS: Any = [
    {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}
]
FORCED: Any = {"type": "function", "function": {"name": "add"}}
ASK: Any = [{"role": "user", "content": "What is 2 + 3?"}]
BOTH_WORKERS = {"nvext": {"extra_fields": ["worker_id", "routing"]}}
GREEDY = {**BOTH_WORKERS, "temperature": 0}  # (this anthropic SDK's stream() takes no temperature)


class Port(pydantic.BaseModel):
    harbour: str = pydantic.Field(max_length=8)
    ships: int = pydantic.Field(ge=0, le=99)


@pytest.fixture(scope="module")
async def frontend() -> AsyncIterator[Frontend]:
    async with hf_frontends({"tool_call_parser": "hermes", "router_mode": "kv"}, pair=True) as (front,):
        yield front


@pytest.fixture
async def client(frontend: Frontend) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


def served_by_the_pair(nvext: Any) -> bool:
    """Whether the answer's ``nvext`` names both workers, and the KV router's decision for each hop."""
    workers = (nvext or {}).get("worker_id") or {}
    routing = (nvext or {}).get("routing") or {}
    return (
        workers.get("prefill_worker_id") is not None
        and workers.get("decode_worker_id") is not None
        and {"prefill", "decode"} <= routing.keys()
    )


async def test_generated_schemas_hold_from_the_prefills_first_token(frontend: Frontend) -> None:
    draw = random.Random(7)
    async with httpx.AsyncClient(base_url=frontend.url, timeout=120) as http:
        for seed in range(20):
            schema = random_schema(draw)
            answer = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": ASK, "max_tokens": 120, "temperature": 1.0, "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
                **BOTH_WORKERS})  # fmt: skip
            body = answer.json()
            assert answer.status_code == 200, body
            assert served_by_the_pair(body.get("nvext")), body
            jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
        choice = await http.post("/v1/completions", json={
            "model": MODEL, "prompt": "Is it? ", "max_tokens": 8, "temperature": 1.0,
            "nvext": {"structured_outputs": {"choice": ["yes", "no"]}}})  # fmt: skip
        assert choice.json()["choices"][0]["text"] in ("yes", "no"), choice.json()


async def test_a_forced_tool_call_and_a_pydantic_parse_on_the_chat_route(client: openai.AsyncOpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": FORCED,
                               "max_tokens": 80, "temperature": 0, "extra_body": BOTH_WORKERS}  # fmt: skip
    whole = await client.chat.completions.create(**options)
    assert served_by_the_pair(whole.model_extra and whole.model_extra.get("nvext"))
    (call,) = whole.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), ADD)  # type: ignore[union-attr]
    arguments = ""
    async for chunk in await client.chat.completions.create(**options, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                arguments += delta.function.arguments or ""  # type: ignore[union-attr]
    assert arguments == call.function.arguments  # type: ignore[union-attr]
    parsed = await client.beta.chat.completions.parse(model=MODEL, messages=ASK, response_format=Port,
                                                      max_tokens=80, temperature=1.0, seed=3)  # fmt: skip
    assert isinstance(parsed.choices[0].message.parsed, Port)


async def test_the_responses_and_messages_apis_return_their_tool_calls(
    frontend: Frontend, client: openai.AsyncOpenAI
) -> None:
    """Each API whole and streamed on the pair: the streamed answer is the whole one."""
    tool = {"type": "function", "name": "add", "parameters": ADD}
    asked: Any = {"model": MODEL, "input": "What is 2 + 3?", "tools": [tool], "temperature": 0,
                  "tool_choice": {"type": "function", "name": "add"}, "max_output_tokens": 80}  # fmt: skip
    response = await client.responses.create(**asked, extra_body=BOTH_WORKERS)
    (call,) = [item for item in response.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), ADD)
    assert served_by_the_pair((response.model_extra or {}).get("nvext")), response
    async with client.responses.stream(**asked) as streamed:
        final = await streamed.get_final_response()
    assert [(item.name, item.arguments) for item in final.output if item.type == "function_call"] == [
        (call.name, call.arguments)
    ]
    options: Any = {"model": MODEL, "max_tokens": 80, "messages": ASK,
                    "tools": [{"name": "add", "input_schema": ADD}], "tool_choice": {"type": "tool", "name": "add"}}  # fmt: skip
    async with anthropic.AsyncAnthropic(base_url=frontend.url, api_key="none", max_retries=0) as claude:
        async with claude.messages.stream(**options, extra_body=GREEDY) as stream:
            ends = [event async for event in stream if event.type == "message_delta"]
            message = await stream.get_final_message()
        whole = await claude.messages.create(**options, extra_body=GREEDY)
    assert served_by_the_pair((ends[0].model_extra or {}).get("nvext")), ends
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == whole.stop_reason == "tool_use"
    jsonschema.validate(use.input, ADD)
    assert [(block.name, block.input) for block in whole.content if block.type == "tool_use"] == [
        (use.name, use.input)
    ]
    assert served_by_the_pair((whole.model_extra or {}).get("nvext")), whole
