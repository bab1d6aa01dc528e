"""OpenAI's Responses API, stateless (``POST /v1/responses``, what ``client.responses.create``
and Codex send with ``store: false``), served by the same pipeline as chat: the body read into
an `OpenAIRequest`, the answer written as a ``response`` object or its events.

- `parse_responses_request`: ``model``, ``input`` (a string, or items: messages whose content
  is a string or ``input_text`` / ``output_text`` parts, roles ``user``, ``assistant``,
  ``system``, ``developer``), ``instructions`` (a system message first), ``max_output_tokens``,
  ``temperature``, ``top_p``, ``stream``, ``text.format`` (``text``, ``json_object``,
  ``json_schema``: structured output, enforced as ``response_format`` is), ``metadata``,
  ``store`` (false, or left out: nothing is stored here), ``user``. ``previous_response_id``,
  ``store: true``, tools and non-text inputs are refused with a 400 naming the field.
- `write_response` and `write_response_stream`: the ``response`` object (one ``message`` output
  item with an ``output_text`` part; ``status`` ``completed``, or ``incomplete`` with
  ``incomplete_details.reason`` ``max_output_tokens``; ``usage``), or its events in OpenAI's
  order, each with its ``sequence_number``: ``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``
  per piece, ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``, ``response.completed`` (or ``response.incomplete``).

Example:
    >>> parsed = parse_responses_request({"model": "m", "input": "hi", "instructions": "Be brief."})
    >>> parsed.api, [m["role"] for m in parsed.messages], parsed.stop.max_tokens is None
    ('responses', ['system', 'user'], True)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import InvalidRequestError
from ..http import HttpRequest, HttpResponse, StreamedResponse, json_response
from .openai import OpenAIRequest, parse_request
from .relay import Outcome
from .writers import SSE_HEADERS, named_event, send_now, whole_text

__all__ = ["parse_responses_request", "write_response", "write_response_stream"]

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of input_text parts", where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise _bad(
                f"{where}[{index}] must be an input_text part {{'type': 'input_text', 'text': ...}}, got {kind!r}",
                where,
            )
    return "".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise _bad("input must be a string or a non-empty list of message items", "input")
    for index, item in enumerate(given):
        where = f"input[{index}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise _bad(
                f"{where}: {kind!r} items are not served yet: send message items (tools are not supported here)",
                where,
            )
        role = item.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", where)
        messages.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
    return messages


def _format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (the same structured output)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("text must be an object such as {'format': {'type': 'text'}}", "text")
    spec = text.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise _bad(
            "text.format must be an object: {'type': 'text' | 'json_object' | 'json_schema', ...}",
            "text.format",
        )
    if spec.get("type") == "json_schema":  # the Responses API flattens json_schema's fields
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if k != "type"}}
    return spec


def parse_responses_request(body: Any) -> OpenAIRequest:
    """Check a Responses API body (see the module docstring); the request the pipeline serves."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise _bad("previous_response_id: responses are not stored here; send the whole conversation as input",
                   "previous_response_id")  # fmt: skip
    if body.get("store") is True:
        raise _bad("store: responses are not stored here: send store: false (or leave it out)", "store")
    for name in ("tools", "tool_choice"):
        if body.get(name):
            raise _bad(f"{name}: tools are not served by this frontend yet: leave {name} out", name)
    stream = body.get("stream", False)
    chat_body = {
        "model": body.get("model"),
        "messages": _messages(body),
        "max_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": stream,
        "response_format": _format(body),
        "user": body.get("user"),
    }
    if stream is True:
        chat_body["stream_options"] = {"include_usage": True}
    try:
        parsed = parse_request(chat_body, "chat")
    except InvalidRequestError as exc:  # the same checks, the field named as the Responses API's
        if exc.param is not None and exc.param.split(".")[0] in _PARAMS:
            head, _, rest = exc.param.partition(".")
            param = _PARAMS[head] + (f".{rest}" if rest and head != "response_format" else "")
            raise _bad(str(exc), param) from None
        raise
    parsed.api = "responses"
    parsed.echoed = {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "metadata": body.get("metadata") or {},
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "user": body.get("user"),
    }
    return parsed


def _response(parsed: OpenAIRequest, outcome: Outcome, status: str, output: list[dict[str, Any]],
              usage: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    incomplete = status == "incomplete"
    return {
        "id": "resp_" + (outcome.request_id or ""),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": parsed.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": usage,
        **(parsed.echoed or {}),
    }


def _item(outcome: Outcome, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": "msg_" + (outcome.request_id or ""), "status": status,
            "role": "assistant", "content": content}  # fmt: skip


def _usage(prompt: Sequence[int], outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": len(prompt),
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens or 0},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": len(prompt) + outcome.completion_tokens,
    }


def _status(outcome: Outcome) -> str:
    return "incomplete" if outcome.finish_reason == "length" else "completed"


async def write_response(
    parsed: OpenAIRequest, pieces: AsyncIterator[str], outcome: Outcome, prompt: Sequence[int]
) -> HttpResponse:
    """The whole answer as one ``response`` object; an error mid-stream is an `EngineError` (a 500)."""
    text = await whole_text(pieces, outcome)
    status = _status(outcome)
    body = _response(parsed, outcome, status, [_item(outcome, text, "completed")], _usage(prompt, outcome))
    return json_response(body, headers=outcome.headers)


class _Events:
    """The stream's events, each with the next ``sequence_number``."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self._number = 0

    def add(self, kind: str, **data: Any) -> None:
        self.pending.append(named_event(kind, {"sequence_number": self._number, **data}))
        self._number += 1

    def take(self) -> bytes:
        out, self.pending = "".join(self.pending).encode(), []
        return out


async def write_response_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """The answer as the Responses API's events (see the module docstring); an error mid-stream
    is an ``error`` event and a ``response.failed``."""
    response = request.stream({**SSE_HEADERS, **outcome.headers})
    events = _Events()
    item_id = "msg_" + (outcome.request_id or "")
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    events.add("response.created", response=_response(parsed, outcome, "in_progress", [], None))
    events.add("response.in_progress", response=_response(parsed, outcome, "in_progress", [], None))
    events.add("response.output_item.added", output_index=0, item=_item(outcome, None, "in_progress"))
    events.add(
        "response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []}
    )
    texts = []
    async for text in pieces:
        if text:
            texts.append(text)
            events.add("response.output_text.delta", **where, delta=text, logprobs=[])
        if events.pending and send_now(outcome):
            await response.write(events.take())
    if outcome.error is not None:
        events.add("error", code="server_error", message=outcome.error, param=None)
        failed = _response(parsed, outcome, "failed", [], None)
        failed["error"] = {"code": "server_error", "message": outcome.error}
        events.add("response.failed", response=failed)
    else:
        text = "".join(texts)
        part = {"type": "output_text", "text": text, "annotations": []}
        events.add("response.output_text.done", **where, text=text, logprobs=[])
        events.add("response.content_part.done", **where, part=part)
        item = _item(outcome, text, "completed")
        events.add("response.output_item.done", output_index=0, item=item)
        status = _status(outcome)
        final = _response(parsed, outcome, status, [item], _usage(prompt, outcome))
        events.add("response.completed" if status == "completed" else "response.incomplete", response=final)
    await response.write_eof(events.take())
    return response
