"""Tool calling on the chat route (``--tool-call-parser hermes``), with the hf engine and the real
tiny model, checked with the ``openai`` SDK: the template renders the tools, a forced call
(``tool_choice`` required or a named function) is made by grammar so its arguments always
validate, a streamed call reassembles to the unstreamed one, a call and its result go back in the
next turn, ``tool_choice: none`` renders no tools, output that does not parse stays text, and
what cannot be served is a 400 naming the field."""

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
from dynamo_nb.frontend.openai import parse_request
from dynamo_nb.frontend.writers import read_tool_calls
from dynamo_nb.llm.tool_calls import parse_tool_calls

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny-llama"
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
SHOUT = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 6}}, "required": ["text"],
         "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}},
    {
        "type": "function",
        "function": {"name": "shout", "description": "Upper-case a text", "parameters": SHOUT},
    },
]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]


OTHER_PARSERS = ("llama3_json", "mistral", "qwen3_coder")


@pytest.fixture(scope="module")
async def frontends() -> AsyncIterator[list[Frontend]]:
    """One frontend reading Hermes tool calls, one reading none, then one per other format, over
    the same hf worker."""
    configs = [{"tool_call_parser": "hermes"}, {}, *({"tool_call_parser": name} for name in OTHER_PARSERS)]
    async with hf_frontends(*configs) as fronts:
        yield fronts


@pytest.fixture
async def client(frontends: list[Frontend]) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=frontends[0].url + "/v1", api_key="none", max_retries=0)
    yield sdk
    await sdk.close()


async def test_a_named_tool_is_called_with_valid_arguments(client: openai.AsyncOpenAI) -> None:
    for seed in range(10):
        completion = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=1.0, seed=seed,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "add"}},
        )  # fmt: skip
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), ADD)


async def test_required_calls_one_of_the_tools(client: openai.AsyncOpenAI) -> None:
    for seed in range(10):
        completion = await client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=1.0,  # type: ignore[arg-type]
            seed=seed,
        )  # fmt: skip
        (call,) = completion.choices[0].message.tool_calls or []
        schema = {"add": ADD, "shout": SHOUT}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)


async def test_a_streamed_call_reassembles_to_the_unstreamed_one(client: openai.AsyncOpenAI) -> None:
    options: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 80, "temperature": 0,
                               "tool_choice": {"type": "function", "function": {"name": "shout"}}}  # fmt: skip
    whole = (await client.chat.completions.create(**options)).choices[0]
    names, arguments, finish = [], "", None
    stream = await client.chat.completions.create(**options, stream=True)
    async for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names.append(delta.function.name)  # type: ignore[union-attr]
                arguments += delta.function.arguments or ""  # type: ignore[union-attr]
            finish = choice.finish_reason or finish
    (call,) = whole.message.tool_calls or []
    assert names == ["shout"] and arguments == call.function.arguments and finish == "tool_calls"


async def test_a_call_and_its_result_go_back_in_the_next_turn(
    frontends: list[Frontend], client: openai.AsyncOpenAI
) -> None:
    first = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0,  # type: ignore[arg-type]
    )  # fmt: skip
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    turn = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = await client.chat.completions.create(
        model=MODEL, messages=turn, tools=TOOLS, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert second.choices[0].message.content is not None or second.choices[0].message.tool_calls
    assert second.usage is not None and first.usage is not None
    assert (
        second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    )  # the turn is in it


async def test_tool_choice_none_renders_no_tools(client: openai.AsyncOpenAI) -> None:
    plain = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    none = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none",  # type: ignore[arg-type]
                                                max_tokens=8, temperature=0)  # fmt: skip
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert (
        none.usage is not None
        and plain.usage is not None
        and none.usage.prompt_tokens == plain.usage.prompt_tokens
    )


def test_the_hermes_parser_on_its_formats_examples_and_malformed_output() -> None:
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
    content, calls = parse_tool_calls(two)
    assert content is None and [c.name for c in calls] == ["add", "shout"]
    assert json.loads(calls[1].arguments) == {"text": "hi"} and calls[0].id != calls[1].id
    for text in ("no call here", "<tool_call>{broken</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                 "<tool_call>unclosed"):  # fmt: skip
        assert parse_tool_calls(text) == (text, [])


@pytest.mark.parametrize(
    ("body", "param", "on_plain"),
    [
        ({"tools": TOOLS}, "tools", True),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", False),
        ({"tools": [{"type": "function"}]}, "tools[0]", False),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", False),
        ({"functions": [{"name": "add"}]}, "functions", False),
    ],
)  # fmt: skip
async def test_what_cannot_be_served_is_a_400_naming_the_field(
    frontends: list[Frontend], body: dict[str, Any], param: str, on_plain: bool
) -> None:
    front = frontends[1] if on_plain else frontends[0]
    async with httpx.AsyncClient(base_url=front.url, timeout=60) as http:
        answer = await http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4, **body}
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()


@pytest.mark.parametrize("parser", OTHER_PARSERS)
async def test_each_format_forces_and_reads_back_a_valid_call(frontends: list[Frontend], parser: str) -> None:
    front = frontends[2 + OTHER_PARSERS.index(parser)]
    async with openai.AsyncOpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0) as sdk:
        for seed in range(3):
            completion = await sdk.chat.completions.create(
                model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80,  # type: ignore[arg-type]
                temperature=1.0, seed=seed,
            )  # fmt: skip
            choice = completion.choices[0]
            (call,) = choice.message.tool_calls or []
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            jsonschema.validate(
                json.loads(call.function.arguments), {"add": ADD, "shout": SHOUT}[call.function.name]
            )


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    two = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
    for parallel, names in ((True, ["add", "shout"]), (False, ["add"])):
        parsed = parse_request(
            {"model": MODEL, "messages": ASK, "tools": TOOLS, "parallel_tool_calls": parallel}, "chat"
        )
        parsed.tool_parser = "hermes"
        assert [call.name for call in read_tool_calls(two, parsed)[1]] == names
