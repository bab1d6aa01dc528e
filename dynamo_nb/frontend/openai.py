"""The OpenAI request bodies the frontend accepts, checked field by field.

Every rejected field raises `InvalidRequestError` naming the field (OpenAI's ``param``) and
what to send instead; the server turns it into a 400.

Example:
    >>> req = parse_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "chat")
    >>> req.model, req.stream, req.sampling.temperature
    ('m', False, None)
    >>> parse_request({"model": "m", "messages": []}, "chat")
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.InvalidRequestError: messages must be a non-empty list of {"role", "content"} objects
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..llm.guided import GuidedDecoding
from ..llm.protocol import DEFAULT_MAX_TOKENS, SamplingOptions, StopConditions
from ..llm.tool_calls import check_tools, forced_tool_grammar
from ..runtime.instance import parse_instance_id

__all__ = [
    "PRIORITY_HEADERS",
    "OpenAIRequest",
    "check_text",
    "parse_request",
    "use_tool_parser",
    "with_priority_headers",
]

# A body that can hold a lone surrogate holds an escaped one ("\\ud800") or its UTF-8-like bytes
# (ED A0..BF ..), which json.loads lets through: only such a body is walked.
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
COMPLETIONS_DEFAULT_MAX_TOKENS = DEFAULT_MAX_TOKENS  # as OpenAI and vLLM


@dataclass
class OpenAIRequest:
    """A checked ``/v1/chat/completions`` (kind ``chat``) or ``/v1/completions`` body."""

    kind: str
    model: str
    stream: bool
    include_usage: bool
    stop: StopConditions
    sampling: SamplingOptions
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    extra_fields: frozenset[str] = frozenset()
    routing: dict[str, Any] | None = None
    priority: float = 0.0  # nvext.agent_hints.priority: soft, higher first (Dynamo's polarity)
    strict_priority: int = 0  # nvext.agent_hints.strict_priority: a tier, higher always first
    return_token_ids: bool = False  # vLLM's: each choice also carries its token ids (and the prompt's)
    guided: GuidedDecoding | None = None  # response_format / nvext.structured_outputs, compiled once
    api: str = "openai"  # the shape of the answer: openai, anthropic (/v1/messages), responses
    echoed: dict[str, Any] | None = None  # what the answer repeats of the request (the Responses API's)
    tools: list[dict[str, Any]] | None = None  # rendered by the chat template (tool_choice not none)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True  # false: the first call only
    tool_parser: str | None = None  # the frontend's --tool-call-parser, set where tools are served


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def _text_content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _bad(
                    f"messages[{index}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                    f"messages[{index}].content",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(
        f"messages[{index}].content must be a string or a list of text parts", f"messages[{index}].content"
    )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad('messages must be a non-empty list of {"role", "content"} objects', "messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f'messages[{index}] must be an object with "role" and "content"', f"messages[{index}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise _bad(
                f"messages[{index}].role must be one of {', '.join(CHAT_ROLES)}; got {role!r}",
                f"messages[{index}].role",
            )
        if message.get("content") is None and role != "assistant":
            raise _bad(
                f"messages[{index}].content is required for a {role} message: send a string or a list of "
                "text parts",
                f"messages[{index}].content",
            )
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _bad(f"messages[{index}].name must be a string, got {name!r}", f"messages[{index}].name")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise _bad(
                f"messages[{index}] is a tool message: it needs tool_call_id (a string)",
                f"messages[{index}].tool_call_id",
            )
        out.append({**message, "content": _text_content(message.get("content"), index)})
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt is empty: send some text", "prompt")
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("batched prompts are not supported: send one prompt per request", "prompt")
    raise _bad("prompt must be a string or a list of token ids", "prompt")


def _unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise _bad(f"n={n!r} is not supported: send n=1 (or leave it out) and repeat the request", "n")
    best_of = body.get("best_of")
    if best_of is not None and (isinstance(best_of, bool) or best_of != 1):
        raise _bad("best_of is not supported: leave it out", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and value != 0:
            raise _bad(f"{name} is not supported by dynamo_nb engines: leave it out or send 0", name)
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise _bad("logprobs are not supported: leave logprobs out", "logprobs")
    if body.get("echo"):
        raise _bad("echo is not supported: leave it out", "echo")
    if body.get("logit_bias"):
        raise _bad("logit_bias is not supported by dynamo_nb engines: leave it out", "logit_bias")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad(f"user must be a string, got {user!r}", "user")
    if body.get("suffix"):
        raise _bad("suffix is not supported: leave it out", "suffix")
    if body.get("priority") is not None:  # vLLM's field, lower first: the opposite polarity of ours
        raise _bad(
            "priority at the top level is vLLM's (lower first); this frontend takes Dynamo's "
            "nvext.agent_hints.priority (higher first) or the x-dynamo-request-priority header: send "
            "{'nvext': {'agent_hints': {'priority': P}}}",
            "priority",
        )
    if body.get("functions") or body.get("function_call"):
        raise _bad("functions is OpenAI's old field: send tools (and tool_choice) instead", "functions")


def _guided(body: dict[str, Any]) -> GuidedDecoding | None:
    """The structured output asked for (`dynamo_nb.llm.guided`), its grammar compiled once here:
    a schema that does not compile is a 400 naming the field before a worker is asked."""
    guided = GuidedDecoding.from_openai(body)
    if guided is not None:
        guided.check()
    return guided


def _flag(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {value!r}", name)
    return value


def _nvext(body: dict[str, Any]) -> dict[str, Any]:
    nvext = body.get("nvext")
    if nvext is None:
        return {}
    if not isinstance(nvext, dict):
        raise _bad("nvext must be an object such as {'extra_fields': ['worker_id']}", "nvext")
    return nvext


def _routing(body: dict[str, Any]) -> dict[str, Any] | None:
    """``nvext.backend_instance_id`` (as in Dynamo): serve the request on that worker instance."""
    instance_id = _nvext(body).get("backend_instance_id")
    if instance_id is None:
        return None
    try:  # an integer (Dynamo's JSON) or the hex string /health and READY lines show
        return {"backend_instance_id": parse_instance_id(instance_id)}
    except ValueError as exc:
        raise _bad(f"nvext.backend_instance_id: {exc}", "nvext.backend_instance_id") from None


MAX_STRICT_PRIORITY = 2**32 - 1  # an unsigned 32-bit tier, as Dynamo's
PRIORITY_HEADERS = {
    "priority": "x-dynamo-request-priority",
    "strict_priority": "x-dynamo-request-strict-priority",
}


def _priority_value(name: str, value: Any, where: str) -> float | int:
    """A checked ``priority`` (any finite number) or ``strict_priority`` (an unsigned integer)."""
    if name == "strict_priority":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STRICT_PRIORITY:
            raise _bad(
                f"{where} must be an integer from 0 to {MAX_STRICT_PRIORITY} (a tier), got {value!r}", where
            )
        return value
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise _bad(f"{where} must be a finite number (higher: sooner), got {str(value)[:40]}", where)
    return float(value)


AGENT_HINTS = ("priority", "strict_priority", "osl", "speculative_prefill", "latency_sensitivity")
"""The hints Dynamo's ``nvext.agent_hints`` has: the first two are used here, the rest accepted
and ignored; any other name is refused, as Dynamo refuses it."""


def _agent_hints(body: dict[str, Any]) -> dict[str, float | int]:
    """``nvext.agent_hints``' ``priority`` and ``strict_priority`` (as in Dynamo); Dynamo's other
    hints (`AGENT_HINTS`) are accepted and ignored, a name it does not have is a 400."""
    hints = _nvext(body).get("agent_hints")
    if hints is None:
        return {}
    if not isinstance(hints, dict):
        raise _bad("nvext.agent_hints must be an object such as {'priority': 10}", "nvext.agent_hints")
    for name in hints:
        if name not in AGENT_HINTS:
            close = difflib.get_close_matches(str(name), AGENT_HINTS, n=1)
            meant = f"did you mean {close[0]}? " if close else ""
            raise _bad(
                f"nvext.agent_hints.{name} is not a hint: {meant}the hints are {', '.join(AGENT_HINTS)}",
                f"nvext.agent_hints.{name}",
            )
    return {
        name: _priority_value(name, hints[name], f"nvext.agent_hints.{name}")
        for name in PRIORITY_HEADERS
        if hints.get(name) is not None
    }


def with_priority_headers(request: OpenAIRequest, headers: Mapping[str, str]) -> OpenAIRequest:
    """``request`` with ``x-dynamo-request-priority`` / ``x-dynamo-request-strict-priority``
    applied: a header overrides its ``nvext.agent_hints`` field (as in Dynamo).

    Example:
        >>> parsed = parse_request({"model": "m", "prompt": "hi"}, "completions")
        >>> with_priority_headers(parsed, {"x-dynamo-request-strict-priority": "2"}).strict_priority
        2
    """
    for name, header in PRIORITY_HEADERS.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value: Any = int(raw) if name == "strict_priority" else float(raw)
        except ValueError:
            value = raw
        setattr(request, name, _priority_value(name, value, f"the {header} header"))
    return request


def _extra_fields(body: dict[str, Any]) -> frozenset[str]:
    """``nvext.extra_fields`` (as in Dynamo): response fields asked for, e.g. ``["worker_id"]``."""
    fields = _nvext(body).get("extra_fields") or []
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise _bad("nvext.extra_fields must be a list of names such as ['worker_id']", "nvext.extra_fields")
    return frozenset(fields)


def _bad_text(value: Any, path: str) -> str | None:
    """The path of the first string (or key) in ``value`` that is not valid Unicode text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{path} (a lone surrogate {value[exc.start]!r} at character {exc.start})"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _bad_text(key, f"{path}.{key!r} (a key)") or _bad_text(
                item, f"{path}.{key}" if path else key
            )
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _bad_text(item, f"{path}[{index}]")
            if found:
                return found
    return None


def check_text(raw: bytes, body: Any) -> None:
    """Refuse a body (``raw``, decoded as ``body``) with text that JSON allows but Unicode does
    not — a lone surrogate such as ``"\\ud800"`` — naming the field (a 400, not an error deep in
    the tokenizer). Free unless the raw body holds a surrogate's escape or bytes.

    Example:
        >>> check_text(b'{"prompt": "\\\\ud800"}', {"prompt": "\\ud800"})
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.InvalidRequestError: prompt (a lone surrogate '\\ud800' at character 0) is not valid Unicode text: send valid UTF-8 (escape a character beyond U+FFFF as a surrogate pair, high then low)
    """
    if _SURROGATE_HINT.search(raw) is None:
        return
    found = _bad_text(body, "")
    if found:
        field = found.split(" ", 1)[0]
        raise _bad(
            f"{found} is not valid Unicode text: send valid UTF-8 (escape a character beyond U+FFFF "
            "as a surrogate pair, high then low)",
            field,
        )


def parse_request(body: Any, kind: str) -> OpenAIRequest:
    """Check an OpenAI request body; ``kind`` is ``chat`` or ``completions``."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required: name one of the models listed by GET /v1/models", "model")
    _unsupported(body)
    stream = _flag(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise _bad("stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(stream_options, dict):
            raise _bad("stream_options must be an object such as {'include_usage': true}", "stream_options")
        include_usage = _flag(stream_options, "include_usage")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None and kind == "completions":
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    stop = StopConditions.from_dict(
        {
            "max_tokens": max_tokens,
            "ignore_eos": _flag(body, "ignore_eos"),
            "min_tokens": body.get("min_tokens"),
            "stop": body.get("stop"),
        }
    )  # the same checks a worker makes of what it is sent (`dynamo_nb.llm.protocol`)
    sampling = SamplingOptions.from_dict({k: body.get(k) for k in ("temperature", "top_p", "top_k", "seed")})
    request = OpenAIRequest(
        kind,
        model,
        stream,
        include_usage,
        stop,
        sampling,
        extra_fields=_extra_fields(body),
        routing=_routing(body),
        return_token_ids=_flag(body, "return_token_ids"),
        guided=_guided(body),
        **_agent_hints(body),  # type: ignore[arg-type]  # priority: float, strict_priority: int
    )
    if kind == "chat":
        request.messages = _messages(body)
        if body.get("tools") is not None:
            _tools(request, body)
    else:
        request.prompt = _prompt(body)
        if body.get("tools"):
            raise _bad("tools are served on /v1/chat/completions, not /v1/completions", "tools")
    return request


def _tools(request: OpenAIRequest, body: dict[str, Any]) -> None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``: ``none`` renders no tools;
    ``required`` or a named function forces one call, by a grammar in the format the frontend
    reads calls in (`forced_tool_grammar`, made when the request is preprocessed)."""
    tools, choice = check_tools(body["tools"], body.get("tool_choice"))
    request.tool_choice = choice
    request.parallel_tool_calls = _flag(body, "parallel_tool_calls", default=True)
    if choice == "none":
        return
    request.tools = tools
    if choice != "auto" and request.guided is not None:
        raise _bad("tool_choice forces a tool call: leave response_format out, or send tool_choice auto",
                   "tool_choice")  # fmt: skip


def use_tool_parser(request: OpenAIRequest, parser: str) -> None:
    """Read ``request``'s tool calls with ``parser``; a forced ``tool_choice`` becomes the grammar
    of one call in that format."""
    request.tool_parser = parser
    if request.tools and request.tool_choice not in ("auto", "none"):
        grammar = forced_tool_grammar(request.tools, request.tool_choice, parser=parser)
        request.guided = GuidedDecoding("grammar", grammar, "tool_choice")
