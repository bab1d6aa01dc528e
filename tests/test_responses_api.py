"""OpenAI's Responses API, stateless (``POST /v1/responses``), checked with the official
``openai`` SDK against the hf engine (the real tiny model), in this process: ``responses.create``
and ``responses.stream`` parse into the SDK's own types, a streamed answer reassembles to the
unstreamed one, the text is what the chat route answers for the same conversation, ``text.format``
enforces a JSON schema, function tools are called (a forced call validates, streamed as its
arguments' events, a call and its output go back as input items), and what is not served (stored
responses, built-in tools, tools on a frontend that reads no calls) is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from dynamo_nb.frontend import Frontend

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny-llama"
INSTRUCTIONS = "You answer in one sentence."
ASKED = "What does a harbour keep?"


ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
TOOLS: Any = [
    {"type": "function", "name": "add", "description": "Add two numbers", "parameters": ADD, "strict": True}
]
FORCED: Any = {"type": "function", "name": "add"}


@pytest.fixture
async def client(frontend: Frontend) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


@pytest.fixture
async def tools_client(frontends: tuple[Frontend, Frontend]) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=frontends[1].url + "/v1", api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


async def test_a_response_is_openais_shape_and_the_chat_routes_text(
    frontend: Frontend, client: openai.AsyncOpenAI
) -> None:
    response = await client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASKED,
                                             max_output_tokens=24, temperature=0, store=False)  # fmt: skip
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output[0].type == "message" and response.output_text
    async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
        chat = (await http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASKED}]})).json()  # fmt: skip
    assert response.output_text == chat["choices"][0]["message"]["content"]
    assert response.usage is not None and response.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert response.usage.output_tokens == chat["usage"]["completion_tokens"]
    cut = await client.responses.create(model=MODEL, input=ASKED, max_output_tokens=3, temperature=0)
    assert (
        cut.status == "incomplete"
        and cut.incomplete_details
        and cut.incomplete_details.reason == "max_output_tokens"
    )


async def test_a_streamed_response_reassembles_to_the_unstreamed_one(client: openai.AsyncOpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": ASKED}]}], "max_output_tokens": 40, "temperature": 0}  # fmt: skip
    whole = await client.responses.create(**options)
    kinds, deltas, numbers = [], [], []
    async with client.responses.stream(**options) as stream:
        async for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert "".join(deltas) == whole.output_text == final.output_text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete") and numbers == list(range(len(numbers)))


async def test_text_format_enforces_a_json_schema(client: openai.AsyncOpenAI) -> None:
    schema = {"type": "object", "properties": {"harbour": {"type": "string", "maxLength": 8},
              "ships": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["harbour", "ships"],
              "additionalProperties": False}  # fmt: skip
    response = await client.responses.create(
        model=MODEL, input=ASKED, max_output_tokens=80, temperature=1.0,
        text={"format": {"type": "json_schema", "name": "port", "schema": schema, "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(response.output_text), schema)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ASKED, "store": True}, "store"),
        ({"input": ASKED, "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": ASKED, "tools": [{"type": "function", "name": "calc"}]}, "tools"),
        ({"input": ASKED, "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": [{"type": "function_call_output", "output": "4"}]}, "input[0]"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
        ({"input": ASKED, "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": ASKED, "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "nonsense"}}}},
         "text.format"),
    ],
)  # fmt: skip
async def test_what_is_not_served_is_a_400_naming_the_field(
    frontend: Frontend, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
        answer = await http.post("/v1/responses", json={"model": MODEL, **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()


async def test_a_forced_function_call_validates_and_streams_as_its_events(
    tools_client: openai.AsyncOpenAI,
) -> None:
    for seed in range(4):
        response = await tools_client.responses.create(
            model=MODEL, input="What is 2 + 3?", tools=TOOLS, tool_choice=FORCED, max_output_tokens=60,
            temperature=1.0, extra_body={"seed": seed},
        )  # fmt: skip
        (call,) = [item for item in response.output if item.type == "function_call"]
        assert call.name == "add" and call.call_id.startswith("call_") and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), ADD)
    options: dict[str, Any] = {"model": MODEL, "input": "What is 2 + 3?", "tools": TOOLS, "tool_choice": FORCED,
                               "max_output_tokens": 60, "temperature": 0}  # fmt: skip
    whole = await tools_client.responses.create(**options)
    kinds, arguments = [], ""
    async with tools_client.responses.stream(**options) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                arguments += event.delta
        final = await stream.get_final_response()
    (call,) = [item for item in whole.output if item.type == "function_call"]
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert arguments == call.arguments == streamed.arguments and streamed.name == "add"
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"


async def test_a_call_and_its_output_go_back_as_input_items(
    frontends: tuple[Frontend, Frontend], tools_client: openai.AsyncOpenAI
) -> None:
    arguments = '{"a": 2, "b": 3}'
    items: Any = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
    response = await tools_client.responses.create(model=MODEL, input=items, tools=TOOLS, max_output_tokens=12,
                                                   temperature=0)  # fmt: skip
    turn = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]  # fmt: skip
    async with httpx.AsyncClient(base_url=frontends[1].url, timeout=60) as http:
        chat = (await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": turn, "max_tokens": 12, "temperature": 0,
            "tools": [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]})).json()  # fmt: skip
    assert response.usage is not None and response.usage.input_tokens == chat["usage"]["prompt_tokens"]
    message = chat["choices"][0]["message"]
    assert response.output_text == (message["content"] or "")
