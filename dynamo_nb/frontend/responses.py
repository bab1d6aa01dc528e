"""OpenAI's Responses API, stateless (``POST /v1/responses``, what ``client.responses.create``
and Codex send with ``store: false``), served by the same pipeline as chat: the body read into
an `OpenAIRequest`, the answer written as a ``response`` object or its events.

- `parse_responses_request`: ``model``, ``input`` (a string, or items: messages whose content
  is a string or ``input_text`` / ``output_text`` parts, roles ``user``, ``assistant``,
  ``system``, ``developer``; ``function_call`` and ``function_call_output`` items, the model's
  earlier calls and their results), ``instructions`` (a system message first), ``tools``
  (function tools), ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``,
  ``temperature``, ``top_p``, ``stream``, ``text.format`` (``text``, ``json_object``,
  ``json_schema``: structured output, enforced as ``response_format`` is), ``metadata``,
  ``store`` (false, or left out: nothing is stored here), ``user``. ``previous_response_id``,
  ``store: true``, built-in tools and non-text inputs are refused with a 400 naming the field.
- `write_response` and `write_response_stream`: the ``response`` object (a ``message`` output
  item with an ``output_text`` part and a ``function_call`` item per call; ``status``
  ``completed``, or ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``;
  ``usage``), or its events in OpenAI's order, each with its ``sequence_number``:
  ``response.created``, ``response.in_progress``, ``response.output_item.added``,
  ``response.content_part.added``, ``response.output_text.delta`` per piece,
  ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``
  (a call's: ``output_item.added``, ``function_call_arguments.delta`` and ``.done``,
  ``output_item.done``), ``response.completed`` (or ``response.incomplete``).

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
from ..llm.tool_calls import ToolCall, ToolCallGate
from .openai import OpenAIRequest, parse_request
from .relay import Outcome
from .writers import SSE_HEADERS, named_event, read_tool_calls, send_now, whole_text

__all__ = ["parse_responses_request", "write_response", "write_response_stream"]

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
_PARAMS = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "tools": "tools",
    "tool_choice": "tool_choice",
}


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
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "function_call":
            _add_call(messages, item, where)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, (str, list)):
                raise _bad(f"{where}: a function_call_output item needs call_id and output (a string)", where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text_of(output, f"{where}.output")})  # fmt: skip
        elif kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", where)
            messages.append({"role": role, "content": _text_of(item.get("content"), f"{where}.content")})
        else:
            raise _bad(
                f"{where}: {kind!r} items are not served: send message, function_call and function_call_output items",
                where,
            )
    return messages


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A ``function_call`` input item as an assistant tool call (calls in a row: one message)."""
    if not all(isinstance(item.get(key), str) for key in ("call_id", "name", "arguments")):
        raise _bad(f"{where}: a function_call item needs call_id, name and arguments (strings)", where)
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    """The Responses API's function tools and ``tool_choice`` as chat's."""
    tools = body.get("tools")
    if not tools:
        return None, None
    if not isinstance(tools, list):
        raise _bad("tools must be a list of {'type': 'function', 'name': ..., 'parameters': {...}}", "tools")
    chat_tools = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise _bad(
                f"tools[{index}]: {kind!r} tools are not served here: send function tools", f"tools[{index}]"
            )
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        chat_tools.append({"type": "function", "function": function})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return chat_tools, choice


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
    stream = body.get("stream", False)
    tools, tool_choice = _tools(body)
    chat_body = {
        "model": body.get("model"),
        "messages": _messages(body),
        "max_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": stream,
        "response_format": _format(body),
        "user": body.get("user"),
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "nvext": body.get("nvext"),  # the kit's and Dynamo's extensions: routing, priorities, extra fields
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
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": parsed.parallel_tool_calls,
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
        **({"nvext": outcome.nvext} if usage is not None and outcome.nvext else {}),
    }


def _item(outcome: Outcome, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": "msg_" + (outcome.request_id or ""), "status": status,
            "role": "assistant", "content": content}  # fmt: skip


def _call_item(call: ToolCall, arguments: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output item (``arguments`` as given: empty when the item opens)."""
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
            "name": call.name, "arguments": call.arguments if arguments is None else arguments,
            "status": "completed" if arguments is None else "in_progress"}  # fmt: skip


def _output(outcome: Outcome, text: str, parsed: OpenAIRequest) -> list[dict[str, Any]]:
    """The output items: the message (the text, or what precedes the calls) and one
    ``function_call`` item per call."""
    content, calls = read_tool_calls(text, parsed)
    items = [_item(outcome, content, "completed")] if content or not calls else []
    return items + [_call_item(call) for call in calls]


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
    body = _response(parsed, outcome, status, _output(outcome, text, parsed), _usage(prompt, outcome))
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

    def open_message(self, outcome: Outcome, index: int) -> dict[str, Any]:
        """A message item's opening events; where its text's events go."""
        where = {"item_id": "msg_" + (outcome.request_id or ""), "output_index": index, "content_index": 0}
        self.add("response.output_item.added", output_index=index, item=_item(outcome, None, "in_progress"))
        self.add(
            "response.content_part.added",
            **where,
            part={"type": "output_text", "text": "", "annotations": []},
        )
        return where

    def close_message(self, where: dict[str, Any], item: dict[str, Any]) -> None:
        text = item["content"][0]["text"]
        self.add("response.output_text.done", **where, text=text, logprobs=[])
        self.add("response.content_part.done", **where, part=item["content"][0])
        self.add("response.output_item.done", output_index=where["output_index"], item=item)

    def call(self, item: dict[str, Any], index: int) -> None:
        """A ``function_call`` item's events: added, its arguments (one delta), done."""
        where = {"item_id": item["id"], "output_index": index}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        self.add("response.function_call_arguments.delta", **where, delta=item["arguments"])
        self.add(
            "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
        )
        self.add("response.output_item.done", output_index=index, item=item)


async def write_response_stream(
    request: HttpRequest,
    parsed: OpenAIRequest,
    pieces: AsyncIterator[str],
    outcome: Outcome,
    prompt: Sequence[int],
) -> StreamedResponse:
    """The answer as the Responses API's events (see the module docstring); an error mid-stream
    is an ``error`` event and a ``response.failed``. With tools the text streams until something
    may begin a call (`ToolCallGate`); once the answer is whole and read come the rest of the
    message's text and each call's events."""
    response = request.stream({**SSE_HEADERS, **outcome.headers})
    events = _Events()
    events.add("response.created", response=_response(parsed, outcome, "in_progress", [], None))
    events.add("response.in_progress", response=_response(parsed, outcome, "in_progress", [], None))
    texts = []
    gate = None if parsed.tool_parser is None else ToolCallGate(parsed.tool_parser)
    where = events.open_message(outcome, 0) if gate is None else None
    async for text in pieces:
        if text:
            if gate is None:
                texts.append(text)
            sendable = text if gate is None else gate.feed(text)
            if sendable:
                if where is None:
                    where = events.open_message(outcome, 0)
                events.add("response.output_text.delta", **where, delta=sendable, logprobs=[])
        if events.pending and send_now(outcome):
            await response.write(events.take())
    if outcome.error is not None:
        events.add("error", code="server_error", message=outcome.error, param=None)
        failed = _response(parsed, outcome, "failed", [], None)
        failed["error"] = {"code": "server_error", "message": outcome.error}
        events.add("response.failed", response=failed)
    else:
        output = _output(outcome, "".join(texts) if gate is None else gate.text, parsed)
        for index, item in enumerate(output):
            if item["type"] == "function_call":
                events.call(item, index)
                continue
            rest = "" if gate is None else gate.finish(item["content"][0]["text"])
            if where is None:
                where = events.open_message(outcome, index)
            if rest:  # the content held back while a call might have begun
                events.add("response.output_text.delta", **where, delta=rest, logprobs=[])
            events.close_message(where, item)
        status = _status(outcome)
        final = _response(parsed, outcome, status, output, _usage(prompt, outcome))
        events.add("response.completed" if status == "completed" else "response.incomplete", response=final)
    await response.write_eof(events.take())
    return response
