"""An answer with tools streams its text before the calls, on the chat route and the Responses
and Messages APIs: a scripted engine says a sentence, then writes two Hermes calls, and holds
its stream at the first call until the test lets it go — so the text must have reached the
client before the engine wrote any call (no timing guessed). Checked with the official SDKs:
the streamed text and calls are the unstreamed ones, on all three APIs, and
``parallel_tool_calls: false`` keeps the first call, streamed and whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from test_tool_calls import TOOLS

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines import EchoEngine
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import ModelTokenizer
from dynamo_nb.llm.protocol import LLMEngineOutput, PreprocessedRequest
from dynamo_nb.models import tiny_model_path
from dynamo_nb.runtime.context import Context

pytestmark = pytest.mark.timeout(120)

MODEL = "scripted"
SAID = "Let me work that out for you, then shout it."
CALLS = (
    '\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "shout", "arguments": {"text": "five"}}\n</tool_call>'
)
ASK: Any = [{"role": "user", "content": "What is 2 + 3? Shout it."}]


class ScriptedEngine(EchoEngine):
    """Answers every request with ``SAID`` then ``CALLS``, a token an item; a stream waits at its
    first call's first token until `go` is set (set: it never waits)."""

    def __init__(self) -> None:
        super().__init__()
        tokenizer = ModelTokenizer.load(tiny_model_path())
        self.said = tokenizer.encode(SAID, add_special_tokens=False)
        self.calls = tokenizer.encode(CALLS, add_special_tokens=False)
        self.go = asyncio.Event()
        self.go.set()

    async def generate(  # type: ignore[override]
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        for token in self.said:
            yield LLMEngineOutput([token])
            await asyncio.sleep(0)
        await asyncio.wait_for(self.go.wait(), 60)
        for token in self.calls[:-1]:
            yield LLMEngineOutput([token])
        made = len(self.said) + len(self.calls)
        yield LLMEngineOutput.final(
            [self.calls[-1]],
            "stop",
            prompt_tokens=len(request.token_ids),
            completion_tokens=made,
            cached_tokens=0,
        )


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[Frontend, ScriptedEngine]]:
    async with await DistributedRuntime.create() as runtime:
        engine = ScriptedEngine()
        await serve_engine(runtime, WorkerRole(endpoint="dynamo.scripted.generate"), tiny_model_path(), MODEL,
                           lambda kv_events: engine)  # fmt: skip
        front = await Frontend.start(runtime, port=0, tool_call_parser="hermes")
        await front.wait_for_model(MODEL)
        yield front, engine
        await front.stop()


def test_the_scripts_tokens_decode_to_its_text() -> None:
    """The scripted engine's tokens say exactly ``SAID`` + ``CALLS`` (else the checks below
    would compare the wrong text)."""
    engine = ScriptedEngine()
    tokenizer = ModelTokenizer.load(tiny_model_path())
    assert tokenizer.decode(engine.said + engine.calls, skip_special_tokens=False) == SAID + CALLS


async def test_the_chat_streams_its_text_before_the_engine_writes_a_call(
    served: tuple[Frontend, ScriptedEngine],
) -> None:
    front, engine = served
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 200}
    async with httpx.AsyncClient(base_url=front.url, timeout=60) as http:
        whole = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0]
        assert whole["message"]["content"] == SAID and whole["finish_reason"] == "tool_calls", whole
        engine.go.clear()
        content, calls, finish = "", [], None
        async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
            async for line in answer.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                (choice,) = json.loads(line[6:])["choices"] or [None]
                if choice is None:
                    continue
                delta = choice["delta"]
                if delta.get("content") and not engine.go.is_set():
                    assert SAID.startswith(content + delta["content"]), (content, delta)
                    if content + delta["content"] == SAID:
                        engine.go.set()  # the whole sentence came before any call was written
                content += delta.get("content") or ""
                calls += delta.get("tool_calls") or []
                finish = choice["finish_reason"] or finish
        assert engine.go.is_set(), "the text before the calls did not stream"
    assert content == whole["message"]["content"] and finish == "tool_calls"
    streamed = [(call["function"]["name"], call["function"]["arguments"]) for call in calls]
    assert streamed == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]
    ]
    assert [name for name, _ in streamed] == ["add", "shout"]


async def test_parallel_tool_calls_false_keeps_the_first_call_streamed_and_whole(
    served: tuple[Frontend, ScriptedEngine],
) -> None:
    front, _ = served
    async with openai.AsyncOpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0) as sdk:
        options: Any = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 200}
        for parallel, names in ((True, ["add", "shout"]), (False, ["add"])):
            whole = await sdk.chat.completions.create(**options, parallel_tool_calls=parallel)
            assert [call.function.name for call in whole.choices[0].message.tool_calls or []] == names  # type: ignore[union-attr]
            streamed = []
            async for chunk in await sdk.chat.completions.create(
                **options, parallel_tool_calls=parallel, stream=True
            ):
                for choice in chunk.choices:
                    streamed += [delta.function.name for delta in choice.delta.tool_calls or []]  # type: ignore[union-attr]
            assert streamed == names, parallel


async def test_the_responses_api_streams_its_text_and_then_its_calls(
    served: tuple[Frontend, ScriptedEngine],
) -> None:
    front, engine = served
    tools: Any = [{"type": "function", "name": tool["function"]["name"], "parameters": tool["function"]["parameters"]}
                  for tool in TOOLS]  # fmt: skip
    async with openai.AsyncOpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0) as sdk:
        whole = await sdk.responses.create(
            model=MODEL, input="What is 2 + 3?", tools=tools, max_output_tokens=200
        )
        engine.go.clear()
        text = ""
        async with sdk.responses.stream(model=MODEL, input="What is 2 + 3?", tools=tools,
                                        max_output_tokens=200) as stream:  # fmt: skip
            async for event in stream:
                if event.type == "response.output_text.delta":
                    text += event.delta
                    if text == SAID:
                        engine.go.set()
            final = await stream.get_final_response()
        assert engine.go.is_set(), "the text before the calls did not stream"
    assert whole.output_text == final.output_text == text == SAID

    def calls(response: Any) -> list[tuple[str, str]]:
        return [(item.name, item.arguments) for item in response.output if item.type == "function_call"]

    assert calls(final) == calls(whole) and [name for name, _ in calls(whole)] == ["add", "shout"]


async def test_the_messages_api_streams_its_text_block_and_then_its_tool_use(
    served: tuple[Frontend, ScriptedEngine],
) -> None:
    front, engine = served
    tools: Any = [
        {"name": tool["function"]["name"], "input_schema": tool["function"]["parameters"]} for tool in TOOLS
    ]
    async with anthropic.AsyncAnthropic(base_url=front.url, api_key="none", max_retries=0) as claude:
        options: Any = {"model": MODEL, "max_tokens": 200, "messages": ASK, "tools": tools}
        whole = await claude.messages.create(**options)
        engine.go.clear()
        text = ""
        async with claude.messages.stream(**options) as stream:
            async for event in stream:
                if event.type == "text":
                    text += event.text
                    if text == SAID:
                        engine.go.set()
            final = await stream.get_final_message()
        assert engine.go.is_set(), "the text block did not stream"
    blocks = [
        (block.type, getattr(block, "text", None) or getattr(block, "name", None)) for block in final.content
    ]
    assert blocks == [("text", SAID), ("tool_use", "add"), ("tool_use", "shout")]
    assert [block.model_dump(exclude={"id"}) for block in final.content] == [
        block.model_dump(exclude={"id"}) for block in whole.content
    ]
    assert final.stop_reason == whole.stop_reason == "tool_use"
