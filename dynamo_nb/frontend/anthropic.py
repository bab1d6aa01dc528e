"""Anthropic's Messages API (``POST /v1/messages``, what the ``anthropic`` SDK and Claude Code
send), served by the same pipeline as OpenAI's chat: the body read into an `OpenAIRequest`, the
answer written in Anthropic's shapes.

- `parse_messages_request`: ``model``, ``max_tokens`` (required, as Anthropic's), ``messages``
  (``user`` / ``assistant``, content a string or ``text`` blocks; an assistant's ``tool_use``
  blocks and a user's ``tool_result`` blocks go back to the model as its tool calls and their
  results), ``system`` (a string or ``text`` blocks), ``tools`` (client tools: ``name``,
  ``description``, ``input_schema``), ``tool_choice`` (``auto``, ``any``, ``none``, ``tool`` with
  a ``name``; ``disable_parallel_tool_use``), ``stop_sequences``, ``temperature``, ``top_p``,
  ``top_k``, ``stream``, ``metadata`` (ignored). Server tools and images are refused with a 400
  naming the field; tools need the frontend's ``--tool-call-parser``.
- `write_message` and `write_message_stream`: the message object (``content`` a ``text`` block
  and a ``tool_use`` block per call, ``stop_reason`` ``end_turn``, ``tool_use``, ``max_tokens``
  or ``stop_sequence`` with the ``stop_sequence`` that ended it, ``usage`` with ``input_tokens``
  and ``output_tokens``), or its events: ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` (``text_delta`` per piece; a call's ``input_json_delta``),
  ``content_block_stop``, ``message_delta``, ``message_stop``.
- `anthropic_error_body`: errors in Anthropic's envelope, ``{"type": "error", "error": {"type",
  "message"}}``, with the same HTTP status.

Example:
    >>> parsed = parse_messages_request({"model": "m", "max_tokens": 8, "system": "Be brief.",
    ...                                  "messages": [{"role": "user", "content": "hi"}]})
    >>> parsed.api, parsed.kind, [m["role"] for m in parsed.messages]
    ('anthropic', 'chat', ['system', 'user'])
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import InvalidRequestError
from ..http import HttpRequest, HttpResponse, StreamedResponse, json_response
from ..llm.tool_calls import ToolCall, ToolCallGate
from .openai import OpenAIRequest, parse_request
from .relay import Outcome
from .writers import SSE_HEADERS, named_event, read_tool_calls, send_now, whole_text

__all__ = ["anthropic_error_body", "parse_messages_request", "write_message", "write_message_stream"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
_PARAMS = {"stop": "stop_sequences", "messages": "messages", "max_tokens": "max_tokens"}
_CHOICES = ("auto", "any", "none", "tool")


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _text_of(content: Any, where: str) -> str:
    """A string, or ``text`` blocks joined; any other block is refused naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _bad(f"{where} must be a string or a non-empty list of content blocks", where)
    texts = []
    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        else:
            raise _bad(
                f"{where}[{index}] must be a text block, {{'type': 'text', 'text': ...}}, got {kind!r}", where
            )
    return "".join(texts)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise _bad(f"{where} must be a string or a non-empty list of content blocks", where)
    return content


def _chat_messages(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Messages API message as chat messages: an assistant's ``tool_use`` blocks become its
    tool calls, a user's ``tool_result`` blocks ``tool`` messages (before the user's text)."""
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, where)):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}[{index}]"
        if kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _bad(f"{at}: a tool_use block needs id, name and input", at)
            arguments = json.dumps(block.get("input") or {})
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad(f"{at}: a tool_result block needs tool_use_id", at)
            result = block.get("content", "")
            output = result if isinstance(result, str) else _text_of(result, f"{at}.content")
            if block.get("is_error"):
                output = f"Error: {output}"
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": output})
        elif kind in ("tool_use", "tool_result"):
            raise _bad(
                f"{at}: {kind} blocks belong in {'assistant' if kind == 'tool_use' else 'user'} messages", at
            )
        else:
            texts.append(block)
    text: str | None = _text_of(texts, where) if texts else None
    if role == "assistant":
        return [{"role": role, "content": text, **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": role, "content": text}] if text is not None else [])


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, Any, bool]:
    """Anthropic's client tools, ``tool_choice`` and ``disable_parallel_tool_use`` as chat's
    ``tools``, ``tool_choice`` and ``parallel_tool_calls``."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice is not None and (not isinstance(choice, dict) or choice.get("type") not in _CHOICES):
        raise _bad("tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                   "tool_choice")  # fmt: skip
    parallel = not (choice or {}).get("disable_parallel_tool_use", False)
    if not tools:
        return None, None, parallel
    if not isinstance(tools, list):
        raise _bad("tools must be a list of {'name': ..., 'input_schema': {...}}", "tools")
    chat_tools = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(f"tools[{index}]: {kind!r} (a server tool) is not served here: send client tools "
                       "{'name', 'description', 'input_schema'}", f"tools[{index}]")  # fmt: skip
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{index}] needs a name (and an input_schema)", f"tools[{index}]")
        function = {"name": tool["name"], "description": tool.get("description"),
                    "parameters": tool.get("input_schema", {"type": "object"})}  # fmt: skip
        if function["description"] is None:
            del function["description"]
        chat_tools.append({"type": "function", "function": function})
    kind = (choice or {"type": "auto"})["type"]
    chat_choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {
        "type": "function", "function": {"name": (choice or {}).get("name")}
    }  # fmt: skip
    return chat_tools, chat_choice, parallel


def parse_messages_request(body: Any) -> OpenAIRequest:
    """Check a Messages API body (see the module docstring); the request the pipeline serves."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens is required: the most tokens to generate (1 or more)", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad(
            "messages must be a non-empty list of {'role': 'user' | 'assistant', 'content': ...}", "messages"
        )
    chat: list[dict[str, Any]] = []
    if body.get("system") is not None:
        chat.append({"role": "system", "content": _text_of(body["system"], "system")})
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise _bad(
                f"{where}.role must be user or assistant (the system prompt goes in system), got {role!r}",
                where,
            )
        chat.extend(_chat_messages(role, message.get("content"), f"{where}.content"))
    stream = body.get("stream", False)
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1):
        raise _bad(f"temperature must be between 0 and 1, got {temperature!r}", "temperature")
    openai_body = {
        "model": body.get("model"),
        "messages": chat,
        "max_tokens": max_tokens,
        "stop": body.get("stop_sequences"),
        "temperature": temperature,
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "stream": stream,
        "nvext": body.get("nvext"),  # the kit's and Dynamo's extensions: routing, priorities, extra fields
    }
    tools, choice, parallel = _tools(body)
    if tools:
        openai_body.update(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    if stream is True:
        openai_body["stream_options"] = {"include_usage": True}
    try:
        parsed = parse_request(openai_body, "chat")
    except InvalidRequestError as exc:  # the same checks, the field named as Anthropic's
        if exc.param in _PARAMS:
            raise _bad(str(exc).replace("stop ", "stop_sequences ", 1), _PARAMS[exc.param]) from None
        raise
    parsed.api = "anthropic"
    return parsed


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope for an HTTP ``status``.

    Example:
        >>> anthropic_error_body(400, "max_tokens is required")["error"]["type"]
        'invalid_request_error'
    """
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _stop_reason(outcome: Outcome, calls: list[ToolCall] | None = None) -> str:
    if calls:
        return "tool_use"
    if outcome.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if outcome.finish_reason == "length" else "end_turn"


def _usage(prompt: Sequence[int], outcome: Outcome) -> dict[str, int]:
    usage = {"input_tokens": len(prompt), "output_tokens": outcome.completion_tokens}
    if outcome.cached_tokens:
        usage["cache_read_input_tokens"] = outcome.cached_tokens
    return usage


def _message_id(outcome: Outcome) -> str:
    return "msg_" + (outcome.request_id or "")


def _content(text: str, parsed: OpenAIRequest) -> tuple[list[dict[str, Any]], list[ToolCall]]:
    """The answer's content blocks: its text (or what precedes the calls) and a ``tool_use``
    block per call."""
    content, calls = read_tool_calls(text, parsed)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content or not calls else []
    for call in calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
                       "input": json.loads(call.arguments)})  # fmt: skip
    return blocks, calls


async def write_message(
    parsed: OpenAIRequest, pieces: AsyncIterator[str], outcome: Outcome, prompt: Sequence[int]
) -> HttpResponse:
    """The whole answer as one message object; an error mid-stream is an `EngineError` (a 500)."""
    blocks, calls = _content(await whole_text(pieces, outcome), parsed)
    body = {
        "id": _message_id(outcome),
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": blocks,
        "stop_reason": _stop_reason(outcome, calls),
        "stop_sequence": outcome.stop_sequence,
        "usage": _usage(prompt, outcome),
        **({"nvext": outcome.nvext} if outcome.nvext else {}),
    }
    return json_response(body, headers=outcome.headers)


def _block_events(index: int, block: dict[str, Any]) -> list[str]:
    """A whole ``tool_use`` block's events: start, one delta, stop."""
    start = {**block, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        named_event("content_block_start", {"index": index, "content_block": start}),
        named_event("content_block_delta", {"index": index, "delta": delta}),
        named_event("content_block_stop", {"index": index}),
    ]


async def write_message_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """The answer as Anthropic's server-sent events (see the module docstring); an error
    mid-stream is an ``error`` event. With tools the text streams until something may begin a
    call (`ToolCallGate`); once the answer is whole and read come the rest of the text block and
    a ``tool_use`` block per call."""
    response = request.stream({**SSE_HEADERS, **outcome.headers})
    message: dict[str, Any] = {
        "id": _message_id(outcome),
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": len(prompt), "output_tokens": 0},
    }
    gate = None if parsed.tool_parser is None else ToolCallGate(parsed.tool_parser)
    text_start = named_event(
        "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
    )
    events = [named_event("message_start", {"message": message})]
    text_open = gate is None  # the text block's start is sent
    if text_open:
        events.append(text_start)
    events.append(named_event("ping", {}))
    async for text in pieces:
        sendable = text if gate is None or not text else gate.feed(text)
        if sendable:
            if not text_open:
                events.append(text_start)
                text_open = True
            delta = {"type": "text_delta", "text": sendable}
            events.append(named_event("content_block_delta", {"index": 0, "delta": delta}))
        if events and send_now(outcome):
            await response.write("".join(events).encode())
            events.clear()
    if outcome.error is not None:
        events.append(named_event("error", {"error": {"type": "api_error", "message": outcome.error}}))
    else:
        calls: list[ToolCall] = []
        if gate is None:
            events.append(named_event("content_block_stop", {"index": 0}))
        else:
            blocks, calls = _content(gate.text, parsed)
            for index, block in enumerate(blocks):
                if block["type"] != "text":
                    events.extend(_block_events(index, block))
                    continue
                if not text_open:  # the text block is the first: index 0
                    events.append(text_start)
                rest = gate.finish(block["text"])  # what was held back while a call might have begun
                if rest:
                    delta = {"type": "text_delta", "text": rest}
                    events.append(named_event("content_block_delta", {"index": 0, "delta": delta}))
                events.append(named_event("content_block_stop", {"index": 0}))
        ending = {"stop_reason": _stop_reason(outcome, calls), "stop_sequence": outcome.stop_sequence}
        events.append(
            named_event(
                "message_delta",
                {
                    "delta": ending,
                    "usage": {"output_tokens": outcome.completion_tokens},
                    **({"nvext": outcome.nvext} if outcome.nvext else {}),
                },
            )
        )
        events.append(named_event("message_stop", {}))
    await response.write_eof("".join(events).encode())
    return response
