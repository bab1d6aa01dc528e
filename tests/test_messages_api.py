"""Anthropic's Messages API (``POST /v1/messages``) on the frontend, checked with the official
``anthropic`` SDK against the hf engine (the real tiny model), in this process: every answer
parses into the SDK's own types, a streamed answer reassembles to the unstreamed one, the text is
what OpenAI's chat route answers for the same conversation, stop reasons and usage are
Anthropic's, client tools are called (a forced ``tool_use`` validates, streams as
``input_json_delta``, and a ``tool_use`` with its ``tool_result`` goes back as the chat route's
turn), and bad requests get Anthropic's error envelope with the field named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from dynamo_nb.frontend import Frontend

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny-llama"
SYSTEM = "You answer in one sentence."
ASK = [{"role": "user", "content": "What does a harbour keep?"}]
GREEDY = {"temperature": 0}  # Anthropic's API field (the SDK's newest releases leave it to extra_body)


ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
TOOLS: Any = [{"name": "add", "description": "Add two numbers", "input_schema": ADD}]
FORCED: Any = {"type": "tool", "name": "add"}
SUM = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture
async def tools_client(frontends: tuple[Frontend, Frontend]) -> AsyncIterator[anthropic.AsyncAnthropic]:
    sdk = anthropic.AsyncAnthropic(base_url=frontends[1].url, api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


@pytest.fixture
async def client(frontend: Frontend) -> AsyncIterator[anthropic.AsyncAnthropic]:
    sdk = anthropic.AsyncAnthropic(base_url=frontend.url, api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


async def test_a_message_is_anthropics_shape_and_openais_text(
    frontend: Frontend, client: anthropic.AsyncAnthropic
) -> None:
    message = await client.messages.create(
        model=MODEL,
        max_tokens=24,
        system=SYSTEM,
        messages=ASK,
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    assert isinstance(message, anthropic.types.Message) and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens <= 24
    async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
        chat = await http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, *ASK]})  # fmt: skip
    answer = chat.json()
    assert message.content[0].text == answer["choices"][0]["message"]["content"]
    assert message.usage.input_tokens == answer["usage"]["prompt_tokens"]
    assert message.usage.output_tokens == answer["usage"]["completion_tokens"]


async def test_a_streamed_message_reassembles_to_the_unstreamed_one(client: anthropic.AsyncAnthropic) -> None:
    options: dict[str, Any] = {"model": MODEL, "max_tokens": 40, "messages": ASK, "extra_body": GREEDY}
    whole = await client.messages.create(**options)
    kinds, deltas = [], []
    async with client.messages.stream(**options) as stream:
        async for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta":
                deltas.append(event.delta.text)  # type: ignore[union-attr]
        final = await stream.get_final_message()
    assert "".join(deltas) == whole.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


async def test_stop_reasons_say_why_it_ended(client: anthropic.AsyncAnthropic) -> None:
    long = await client.messages.create(model=MODEL, max_tokens=30, messages=ASK, extra_body=GREEDY)
    text = long.content[0].text  # type: ignore[union-attr]
    cut = await client.messages.create(model=MODEL, max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    stop = text.strip()[len(text.strip()) // 2 :][:3]
    stopped = await client.messages.create(model=MODEL, max_tokens=30, messages=ASK, extra_body=GREEDY,
                                           stop_sequences=[stop])  # fmt: skip
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop, stopped
    assert stop not in stopped.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({"model": MODEL, "messages": ASK}, 400, "invalid_request_error", "max_tokens is required"),
        ({"model": MODEL, "max_tokens": 4, "messages": ASK, "tools": [{"name": "calc"}]}, 400,
         "invalid_request_error", "--tool-call-parser"),
        ({"model": MODEL, "max_tokens": 4, "messages": ASK, "tools": [{"type": "bash_20250124", "name": "bash"}]},
         400, "invalid_request_error", "tools[0]"),
        ({"model": MODEL, "max_tokens": 4, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "maybe"}},
         400, "invalid_request_error", "tool_choice must be"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]}, 400, "invalid_request_error",
         "tool_use blocks belong in assistant messages"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
         "invalid_request_error", "messages[0].content[0] must be a text block"),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, 400,
         "invalid_request_error", "the system prompt goes in system"),
        ({"model": "nope", "max_tokens": 4, "messages": ASK}, 404, "not_found_error", "nope"),
    ],
)  # fmt: skip
async def test_a_bad_request_gets_anthropics_error_envelope(
    frontend: Frontend, body: dict[str, Any], status: int, kind: str, words: str
) -> None:
    async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
        answer = await http.post("/v1/messages", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert (
        error["type"] == "error" and error["error"]["type"] == kind and words in error["error"]["message"]
    ), error


async def test_the_sdk_raises_its_own_error_for_a_refusal(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="temperature must be between 0 and 1"):
        await client.messages.create(model=MODEL, max_tokens=4, messages=ASK, extra_body={"temperature": 1.5})


async def test_a_forced_tool_use_validates_and_streams_as_input_json(
    tools_client: anthropic.AsyncAnthropic,
) -> None:
    for seed in range(4):
        message = await tools_client.messages.create(
            model=MODEL, max_tokens=60, messages=SUM, tools=TOOLS, tool_choice=FORCED,
            extra_body={"temperature": 1.0, "seed": seed},
        )  # fmt: skip
        (use,) = [block for block in message.content if block.type == "tool_use"]
        assert message.stop_reason == "tool_use" and use.name == "add" and use.id.startswith("toolu_")
        jsonschema.validate(use.input, ADD)
    options: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "messages": SUM, "tools": TOOLS,
                               "tool_choice": FORCED, "extra_body": GREEDY}  # fmt: skip
    whole = await tools_client.messages.create(**options)
    partial = ""
    async with tools_client.messages.stream(**options) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial += event.delta.partial_json
        final = await stream.get_final_message()
    (use,) = [block for block in whole.content if block.type == "tool_use"]
    (streamed,) = [block for block in final.content if block.type == "tool_use"]
    assert json.loads(partial) == use.input == streamed.input and final.stop_reason == "tool_use"


async def test_a_tool_use_and_its_result_go_back_as_the_chat_routes_turn(
    frontends: tuple[Frontend, Frontend], tools_client: anthropic.AsyncAnthropic
) -> None:
    turn: Any = [
        *SUM,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]},
    ]  # fmt: skip
    message = await tools_client.messages.create(model=MODEL, max_tokens=12, messages=turn, tools=TOOLS,
                                                 extra_body=GREEDY)  # fmt: skip
    chat_turn = [
        *SUM,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "toolu_1", "type": "function",
         "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
    ]  # fmt: skip
    tools = [
        {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}
    ]
    async with httpx.AsyncClient(base_url=frontends[1].url, timeout=60) as http:
        chat = (await http.post("/v1/chat/completions", json={"model": MODEL, "messages": chat_turn,
                "tools": tools, "max_tokens": 12, "temperature": 0})).json()  # fmt: skip
    assert message.usage.input_tokens == chat["usage"]["prompt_tokens"]
    texts = "".join(block.text for block in message.content if block.type == "text")
    assert texts == (chat["choices"][0]["message"]["content"] or "")
