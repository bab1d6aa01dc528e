"""The writers of the request pipeline: a relayed stream as OpenAI's server-sent events
(``data: {...}`` chunks, ``data: [DONE]``) or as one JSON body.

Example::

    response = await write_stream(http_request, parsed, pieces, outcome, request.token_ids)
    response = await write_unary(parsed, pieces, outcome, request.token_ids)
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from ..errors import EngineError
from ..http import HttpRequest, HttpResponse, StreamedResponse, json_response
from ..llm.protocol import completion_usage
from ..llm.tool_calls import ToolCall, ToolCallGate, parse_tool_calls
from ..runtime.ids import new_request_id
from .error_envelope import error_body
from .openai import OpenAIRequest
from .relay import Outcome

__all__ = [
    "SSE_HEADERS",
    "named_event",
    "read_tool_calls",
    "send_now",
    "whole_text",
    "write_stream",
    "write_unary",
]

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = "data: [DONE]\n\n"


def named_event(kind: str, data: dict[str, Any]) -> str:
    """One named server-sent event whose data is ``{"type": kind, **data}`` (Anthropic's and the
    Responses API's events).

    Example:
        >>> named_event("ping", {})
        'event: ping\\ndata: {"type":"ping"}\\n\\n'
    """
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


def send_now(outcome: Outcome) -> bool:
    """Whether the events ready should go out now: the next piece would wait (the last ones go
    with the stream's end, in one write)."""
    return not outcome.ending and not getattr(outcome.stream, "ready", 0)


async def write_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """Send ``pieces`` as SSE chunks as they come, then the finish reason (and ``nvext``), the
    usage chunk when asked for (``stream_options.include_usage``) and ``[DONE]``; an error
    mid-stream is an error event before ``[DONE]``. With vLLM's ``return_token_ids`` each
    choice also carries the ids generated since the last chunk (``token_ids``), the first the
    ``prompt`` ids (``prompt_token_ids``).

    The events of all pieces already received go out in one write (the headers and the role
    chunk with the first), and the last piece's with the finish chunk and the end of the
    chunked body: a stream whose first item is its last costs one socket write, each event is
    still its own SSE event."""
    if parsed.tool_parser is not None:  # content streams up to a call, calls once the text is whole
        return await _write_tool_stream(request, parsed, pieces, outcome, prompt)
    response = request.stream({**SSE_HEADERS, **outcome.headers})
    chat = parsed.kind == "chat"
    request_id = ("chatcmpl-" if chat else "cmpl-") + (outcome.request_id or new_request_id())
    quote = encode_basestring_ascii  # json.dumps of a str, byte for byte, without its overhead
    # the chunk's head as json.dumps(..., separators=(",", ":")) writes it, without its closing brace
    head = (
        f'{{"id":{quote(request_id)},"object":"{"chat.completion.chunk" if chat else "text_completion"}",'
        f'"created":{int(time.time())},"model":{quote(parsed.model)}'
    )
    events: list[str] = []  # one SSE event per piece, sent together while more are ready
    if chat:
        prefix = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'
        suffix = '},"logprobs":null,"finish_reason":null}]}\n\n'
        events.append(  # the first item is here already (the pipeline opened the stream with it)
            f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
            f'"logprobs":null,"finish_reason":null}}]}}\n\n'
        )
    else:
        prefix = f'data: {head},"choices":[{{"index":0,"text":'
        suffix = ',"logprobs":null,"finish_reason":null}]}\n\n'
    write = response.write
    dumps = json.dumps
    prompt_tokens = len(prompt)
    returned = outcome.returned
    ids = _IdsSince(returned, prompt) if returned is not None else None
    if ids is not None and chat:  # the role chunk is the first: it carries the prompt's ids
        events[0] = events[0].replace('"finish_reason":null}', f'"finish_reason":null{ids.field()}}}', 1)
    async for text in pieces:
        if text:
            more = suffix if ids is None else suffix.replace("null}", f"null{ids.field()}}}", 1)
            events.append(f"{prefix}{quote(text)}{more}")
        if events and send_now(outcome):
            await write("".join(events).encode())
            events.clear()
    if outcome.error is not None:
        events.append(f"data: {dumps(error_body(500, outcome.error))}\n\n")
    else:
        empty = '"delta":{}' if chat else '"text":""'
        nvext = outcome.nvext
        extension = f',"nvext":{dumps(nvext)}' if nvext else ""
        rest = ids.field() if ids is not None else ""
        events.append(
            f'data: {head},"choices":[{{"index":0,{empty},"logprobs":null,'
            f'"finish_reason":"{outcome.finish_reason}"{rest}}}]{extension}}}\n\n'
        )
        if parsed.include_usage:
            counts = completion_usage(prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
            events.append(f'data: {head},"choices":[],"usage":{dumps(counts)}}}\n\n')
    events.append(DONE)
    await response.write_eof("".join(events).encode())  # the last events and the body's end
    return response


def read_tool_calls(text: str, parsed: OpenAIRequest) -> tuple[str | None, list[ToolCall]]:
    """The answer's content and the tool calls in it, read in the frontend's format (none where
    the request has no tools; the first only with ``parallel_tool_calls: false``).

    Example:
        >>> from dynamo_nb.frontend.openai import parse_request
        >>> read_tool_calls("hi", parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "chat"))
        ('hi', [])
    """
    if parsed.tool_parser is None:
        return text, []
    content, calls = parse_tool_calls(text, parsed.tool_parser, tools=parsed.tools)
    return content, calls if parsed.parallel_tool_calls else calls[:1]


async def whole_text(pieces: AsyncIterator[str], outcome: Outcome) -> str:
    """The answer's text, read to its end; an error mid-stream is an `EngineError` (a 500)."""
    text = "".join([piece async for piece in pieces])
    if outcome.error is not None:
        raise EngineError(f"the worker failed mid-stream: {outcome.error}")
    return text


async def write_unary(
    parsed: OpenAIRequest, pieces: AsyncIterator[str], outcome: Outcome, prompt: Sequence[int]
) -> HttpResponse:
    """The whole answer as one JSON body; an error mid-stream is an `EngineError` (a 500). With
    vLLM's ``return_token_ids`` the choice carries ``prompt_token_ids`` and ``token_ids``."""
    prompt_tokens = len(prompt)
    text = await whole_text(pieces, outcome)
    chat = parsed.kind == "chat"
    choice: dict[str, Any] = {"index": 0}
    finish_reason = outcome.finish_reason
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        content, calls = read_tool_calls(text, parsed)
        if calls:
            choice["message"] = {"role": "assistant", "content": content,
                                 "tool_calls": [call.to_openai() for call in calls]}  # fmt: skip
            finish_reason = "tool_calls"
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=finish_reason)
    if outcome.returned is not None:
        choice.update(prompt_token_ids=list(prompt), token_ids=outcome.returned)
    body: dict[str, Any] = {
        "id": ("chatcmpl-" if chat else "cmpl-") + (outcome.request_id or new_request_id()),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [choice],
        "usage": completion_usage(prompt_tokens, outcome.completion_tokens, outcome.cached_tokens),
    }
    nvext = outcome.nvext
    if nvext:
        body["nvext"] = nvext
    return json_response(body, headers=outcome.headers)


async def _write_tool_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """A chat stream whose request has tools, as OpenAI's chunks: the role, the content as it
    comes until something may begin a call (`ToolCallGate`), then, once the answer is whole and
    read, the rest of the content, one ``tool_calls`` delta per call (``index``, ``id``,
    ``function.name`` and ``arguments``) and ``finish_reason: tool_calls``."""
    response = request.stream({**SSE_HEADERS, **outcome.headers})
    request_id = "chatcmpl-" + (outcome.request_id or new_request_id())
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> str:
        body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": parsed.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **more}  # fmt: skip
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    gate = ToolCallGate(parsed.tool_parser or "hermes")
    events = [chunk({"role": "assistant", "content": ""})]
    async for piece in pieces:
        sendable = gate.feed(piece) if piece else ""
        if sendable:
            events.append(chunk({"content": sendable}))
        if events and send_now(outcome):
            await response.write("".join(events).encode())
            events.clear()
    if outcome.error is not None:
        events.append(f"data: {json.dumps(error_body(500, outcome.error))}\n\n")
    else:
        content, calls = read_tool_calls(gate.text, parsed)
        rest = gate.finish(content)
        if rest:
            events.append(chunk({"content": rest}))
        for index, call in enumerate(calls):
            events.append(chunk({"tool_calls": [call.to_openai(index)]}))
        nvext = outcome.nvext
        events.append(
            chunk({}, "tool_calls" if calls else outcome.finish_reason, **({"nvext": nvext} if nvext else {}))
        )
        if parsed.include_usage:
            usage = completion_usage(len(prompt), outcome.completion_tokens, outcome.cached_tokens)
            body = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                    "model": parsed.model, "choices": [], "usage": usage}  # fmt: skip
            events.append(f"data: {json.dumps(body, separators=(',', ':'))}\n\n")
    events.append(DONE)
    await response.write_eof("".join(events).encode())
    return response


class _IdsSince:
    """The ``token_ids`` field of each chunk: the ids generated since the last chunk (the first
    chunk's also ``prompt_token_ids``), as vLLM's ``return_token_ids`` writes them."""

    def __init__(self, returned: list[int], prompt: Sequence[int]) -> None:
        self.returned = returned
        self.prompt: Sequence[int] | None = prompt
        self.sent = 0

    def field(self) -> str:
        new, self.sent = self.returned[self.sent :], len(self.returned)
        text = f',"token_ids":{json.dumps(new)}'
        if self.prompt is not None:
            text = f',"prompt_token_ids":{json.dumps(list(self.prompt))}{text}'
            self.prompt = None
        return text
