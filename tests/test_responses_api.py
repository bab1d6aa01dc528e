"""OpenAI's Responses API, stateless (``POST /v1/responses``), checked with the official
``openai`` SDK against the hf engine (the real tiny model), in this process: ``responses.create``
and ``responses.stream`` parse into the SDK's own types, a streamed answer reassembles to the
unstreamed one, the text is what the chat route answers for the same conversation, ``text.format``
enforces a JSON schema, and what is not served (stored responses, tools) is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from helpers import hf_frontends

from dynamo_nb.frontend import Frontend

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny-llama"
INSTRUCTIONS = "You answer in one sentence."
ASKED = "What does a harbour keep?"


@pytest.fixture(scope="module")
async def frontend() -> AsyncIterator[Frontend]:
    async with hf_frontends() as (front,):
        yield front


@pytest.fixture
async def client(frontend: Frontend) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=frontend.url + "/v1", api_key="none", max_retries=0)
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
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]}, "input[0]"),
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
