"""Anthropic's Messages API (``POST /v1/messages``, what the ``anthropic`` SDK and Claude Code
send), served by the same pipeline as OpenAI's chat: the body read into an `OpenAIRequest`, the
answer written in Anthropic's shapes.

- `parse_messages_request`: ``model``, ``max_tokens`` (required, as Anthropic's), ``messages``
  (``user`` / ``assistant``, content a string or ``text`` blocks), ``system`` (a string or
  ``text`` blocks), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``stream``,
  ``metadata`` (ignored). Tools (``tools``, ``tool_use`` and ``tool_result`` blocks) and images
  are refused with a 400 naming the field.
- `write_message` and `write_message_stream`: the message object (``content`` one ``text``
  block, ``stop_reason`` ``end_turn``, ``max_tokens`` or ``stop_sequence`` with the
  ``stop_sequence`` that ended it, ``usage`` with ``input_tokens`` and ``output_tokens``), or its
  events: ``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``
  (``text_delta``) per piece, ``content_block_stop``, ``message_delta``, ``message_stop``.
- `anthropic_error_body`: errors in Anthropic's envelope, ``{"type": "error", "error": {"type",
  "message"}}``, with the same HTTP status.

Example:
    >>> parsed = parse_messages_request({"model": "m", "max_tokens": 8, "system": "Be brief.",
    ...                                  "messages": [{"role": "user", "content": "hi"}]})
    >>> parsed.api, parsed.kind, [m["role"] for m in parsed.messages]
    ('anthropic', 'chat', ['system', 'user'])
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import InvalidRequestError
from ..http import HttpRequest, HttpResponse, StreamedResponse, json_response
from .openai import OpenAIRequest, parse_request
from .relay import Outcome
from .writers import SSE_HEADERS, named_event, send_now, whole_text

__all__ = ["anthropic_error_body", "parse_messages_request", "write_message", "write_message_stream"]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
_PARAMS = {"stop": "stop_sequences", "messages": "messages", "max_tokens": "max_tokens"}
_UNSERVED = ("tools", "tool_choice")


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
        elif kind in ("tool_use", "tool_result"):
            raise _bad(
                f"{where}[{index}]: {kind} blocks are not served yet: tools are not supported here", where
            )
        else:
            raise _bad(
                f"{where}[{index}] must be a text block, {{'type': 'text', 'text': ...}}, got {kind!r}", where
            )
    return "".join(texts)


def parse_messages_request(body: Any) -> OpenAIRequest:
    """Check a Messages API body (see the module docstring); the request the pipeline serves."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    for name in _UNSERVED:
        if body.get(name):
            raise _bad(f"{name}: tools are not served by this frontend yet: leave {name} out", name)
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
        chat.append({"role": role, "content": _text_of(message.get("content"), f"{where}.content")})
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
    }
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


def _stop_reason(outcome: Outcome) -> str:
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


async def write_message(
    parsed: OpenAIRequest, pieces: AsyncIterator[str], outcome: Outcome, prompt: Sequence[int]
) -> HttpResponse:
    """The whole answer as one message object; an error mid-stream is an `EngineError` (a 500)."""
    text = await whole_text(pieces, outcome)
    body = {
        "id": _message_id(outcome),
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": _stop_reason(outcome),
        "stop_sequence": outcome.stop_sequence,
        "usage": _usage(prompt, outcome),
    }
    return json_response(body, headers=outcome.headers)


async def write_message_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """The answer as Anthropic's server-sent events (see the module docstring); an error
    mid-stream is an ``error`` event."""
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
    events = [
        named_event("message_start", {"message": message}),
        named_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        named_event("ping", {}),
    ]
    async for text in pieces:
        if text:
            events.append(
                named_event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}
                )
            )
        if events and send_now(outcome):
            await response.write("".join(events).encode())
            events.clear()
    if outcome.error is not None:
        events.append(named_event("error", {"error": {"type": "api_error", "message": outcome.error}}))
    else:
        events.append(named_event("content_block_stop", {"index": 0}))
        delta = {"stop_reason": _stop_reason(outcome), "stop_sequence": outcome.stop_sequence}
        events.append(
            named_event(
                "message_delta", {"delta": delta, "usage": {"output_tokens": outcome.completion_tokens}}
            )
        )
        events.append(named_event("message_stop", {}))
    await response.write_eof("".join(events).encode())
    return response
