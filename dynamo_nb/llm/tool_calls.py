"""Tool calls in a model's text, and the grammar that forces one.

A chat template renders a request's ``tools`` (the built-in tiny model's does, Hermes style:
signatures in ``<tools></tools>``, a call written as ``<tool_call>{"name", "arguments"}</tool_call>``,
a result given back in ``<tool_response>``). `parse_tool_calls` reads the calls out of what the
model wrote, in the format ``--tool-call-parser`` names (`TOOL_CALL_PARSERS`, as vLLM and
Dynamo name them): the text before the first call is the message's content; output that does
not parse stays text. `forced_tool_grammar` is the grammar (llguidance's Lark) for
``tool_choice`` ``required`` or a named function: exactly one call of one of the tools, in the
same format, its arguments valid against the tool's ``parameters`` schema, so any model returns
a valid call that its parser reads back.

The formats, one call each:

- ``hermes``: ``<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>`` (several in a row).
- ``llama3_json`` (Llama 3.1/3.2): ``<|python_tag|>{"name": "add", "parameters": {"a": 2}}``, the
  tag optional when the text starts with the object, ``"arguments"`` read as well, several
  calls separated by ``; ``.
- ``mistral``: ``[TOOL_CALLS][{"name": "add", "arguments": {"a": 2}}]`` (a list of calls), or the
  newer tokenizers' ``[TOOL_CALLS]add[ARGS]{"a": 2}`` (repeated for several).
- ``qwen3_coder`` (XML): ``<tool_call>\\n<function=add>\\n<parameter=a>\\n2\\n</parameter>\\n</function>\\n</tool_call>``;
  a parameter's text becomes the type the tool's schema gives it (``tools=`` of
  `parse_tool_calls`; a parameter without one is read as JSON, else kept as a string).

Example:
    >>> content, calls = parse_tool_calls('Sure.<tool_call>\\n{"name": "add", "arguments": {"a": 2}}\\n</tool_call>')
    >>> content, calls[0].name, calls[0].arguments
    ('Sure.', 'add', '{"a": 2}')
    >>> parse_tool_calls("<tool_call>not json</tool_call>")[1]
    []
    >>> [(c.name, c.arguments) for c in parse_tool_calls('{"name": "add", "parameters": {"a": 2}}', "llama3_json")[1]]
    [('add', '{"a": 2}')]
    >>> parse_tool_calls('Adding.[TOOL_CALLS]add[ARGS]{"a": 2}', "mistral")[0]
    'Adding.'
    >>> xml = "<tool_call>\\n<function=add>\\n<parameter=a>\\n2\\n</parameter>\\n</function>\\n</tool_call>"
    >>> add = {"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"}}}}}
    >>> parse_tool_calls(xml, "qwen3_coder", tools=[add])[1][0].arguments
    '{"a": 2}'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import InvalidRequestError
from ..runtime.ids import new_request_id

__all__ = [
    "TOOL_CALL_PARSERS",
    "ToolCall",
    "ToolCallGate",
    "check_tools",
    "forced_tool_grammar",
    "parse_tool_calls",
]

_Schemas = dict[str, dict[str, Any]]  # a function's name -> its parameters schema


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name, its arguments as a JSON string, an id."""

    name: str
    arguments: str
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry (with ``index`` in a streamed delta)."""
        call: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip
        return call if index is None else {"index": index, **call}


def parse_tool_calls(
    text: str, parser: str = "hermes", *, tools: list[dict[str, Any]] | None = None
) -> tuple[str | None, list[ToolCall]]:
    """The content before the calls (its trailing whitespace dropped; None when nothing is left)
    and the calls in ``text``, in the format ``parser`` names; a call that does not parse leaves
    the whole text as content and no calls. ``tools`` (OpenAI's tool dicts) give
    ``qwen3_coder`` its parameters' types."""
    if parser not in _FORMATS:
        raise ValueError(f"unknown tool call parser {parser!r}: use one of {', '.join(TOOL_CALL_PARSERS)}")
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools or []}
    try:
        content, calls = _FORMATS[parser].parse(text, schemas)
    except _Malformed:
        return text, []
    if not calls:
        return text, []
    return content.rstrip() or None, calls


def check_tools(tools: Any, tool_choice: Any) -> tuple[list[dict[str, Any]], Any]:
    """``tools`` and ``tool_choice`` as OpenAI's chat takes them, checked (a 400 naming the field).

    Example:
        >>> tools, choice = check_tools([{"type": "function", "function": {"name": "add"}}], None)
        >>> choice
        'auto'
    """
    if not isinstance(tools, list) or not tools:
        raise InvalidRequestError(
            "tools must be a non-empty list of {'type': 'function', 'function': {...}}", "tools"
        )
    names = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise InvalidRequestError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}",
                f"tools[{index}]",
            )
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise InvalidRequestError(
                f"tools[{index}].function.parameters must be a JSON schema", f"tools[{index}]"
            )
        names.append(function["name"])
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise InvalidRequestError(
                f"tool_choice names {name!r}, which is not one of the tools ({', '.join(names)})",
                "tool_choice",
            )
    elif choice not in ("none", "auto", "required"):
        raise InvalidRequestError(
            "tool_choice must be none, auto, required or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    return tools, choice


def forced_tool_grammar(tools: list[dict[str, Any]], tool_choice: Any, parser: str = "hermes") -> str:
    """The Lark grammar (llguidance's) of one call in the format ``parser`` names: of the function
    ``tool_choice`` names, or of any of ``tools`` (``required``)."""
    if parser not in _FORMATS:
        raise ValueError(f"unknown tool call parser {parser!r}: use one of {', '.join(TOOL_CALL_PARSERS)}")
    functions = [tool["function"] for tool in tools]
    if isinstance(tool_choice, dict):
        functions = [f for f in functions if f["name"] == tool_choice["function"]["name"]]
    return _FORMATS[parser].grammar(functions)


# What every format shares: a call made of a name and an arguments object, JSON read or refused,
# a JSON schema of the call object, a %json rule (compact, as a small model would otherwise pad).


class _Malformed(Exception):
    """The text holds something that looks like a call but is not one: it stays text."""


def _tool_call(name: Any, arguments: Any) -> ToolCall:
    """The call of ``name`` with ``arguments`` (a dict), or `_Malformed`."""
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise _Malformed
    return ToolCall(name, json.dumps(arguments), "call_" + new_request_id()[:24])


def _call_from_object(data: Any, *arguments_keys: str) -> ToolCall:
    """The call an object ``{"name": ..., <one of arguments_keys>: {...}}`` writes (no arguments: ``{}``)."""
    if not isinstance(data, dict):
        raise _Malformed
    key = next((k for k in arguments_keys if k in data), None)
    return _tool_call(data.get("name"), data[key] if key is not None else {})


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise _Malformed from None


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    return function.get("parameters") or {"type": "object"}


def _call_schema(functions: list[dict[str, Any]], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call object ``{"name": ..., arguments_key: {...}}`` of one of ``functions``."""
    schemas = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, arguments_key: _parameters(f)},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule's body: JSON valid against ``schema``, written without free whitespace."""
    return f"%json {json.dumps({**schema, 'x-guidance': {'whitespace_flexible': False}})}"


# hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, several in a row.

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _parse_hermes(text: str, schemas: _Schemas) -> tuple[str, list[ToolCall]]:
    found = list(_HERMES.finditer(text))
    calls = [_call_from_object(_json(match.group(1)), "arguments") for match in found]
    return (text[: found[0].start()] if found else text), calls


def _hermes_grammar(functions: list[dict[str, Any]]) -> str:
    call = _json_rule(_call_schema(functions, "arguments"))
    return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n'


# llama3_json: [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}

_PYTHON_TAG = "<|python_tag|>"


def _parse_llama3_json(text: str, schemas: _Schemas) -> tuple[str, list[ToolCall]]:
    tag = text.find(_PYTHON_TAG)
    if tag >= 0:
        content, body = text[:tag], text[tag + len(_PYTHON_TAG) :]
    elif text.lstrip().startswith("{"):
        content, body = "", text
    else:
        return text, []
    return content, [_call_from_object(data, "parameters", "arguments") for data in _json_values(body, ";")]


def _json_values(text: str, separator: str) -> list[Any]:
    """The JSON values ``text`` holds, one after another with ``separator`` (and any whitespace)
    between them; `_Malformed` when anything else is there."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        at = len(text) - len(text[at:].lstrip())
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            raise _Malformed from None
        values.append(value)
        rest = text[at:].lstrip()
        if not rest:
            return values
        if not rest.startswith(separator):
            raise _Malformed
        at = len(text) - len(rest) + len(separator)


def _llama3_json_grammar(functions: list[dict[str, Any]]) -> str:
    return f"start: call\ncall: {_json_rule(_call_schema(functions, 'parameters'))}\n"


# mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or [TOOL_CALLS]name[ARGS]{...} repeated.

_TOOL_CALLS, _ARGS = "[TOOL_CALLS]", "[ARGS]"


def _parse_mistral(text: str, schemas: _Schemas) -> tuple[str, list[ToolCall]]:
    content, found, after = text.partition(_TOOL_CALLS)
    if not found:
        return text, []
    calls = []
    for part in after.split(_TOOL_CALLS):
        if _ARGS in part:
            name, _, arguments = part.partition(_ARGS)
            calls.append(_tool_call(name.strip(), _json(arguments)))
        else:
            listed = _json(part)
            if not isinstance(listed, list):
                raise _Malformed
            calls.extend(_call_from_object(data, "arguments") for data in listed)
    return content, calls


def _mistral_grammar(functions: list[dict[str, Any]]) -> str:
    one_call = {"type": "array", "items": _call_schema(functions, "arguments"), "minItems": 1, "maxItems": 1}
    return f'start: "{_TOOL_CALLS}" calls\ncalls: {_json_rule(one_call)}\n'


# qwen3_coder: <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>

_QWEN_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]*)>(.*?)</function>\s*</tool_call>", re.DOTALL)
_QWEN_PARAMETERS = re.compile(r"(?:\s*<parameter=[^>\n]*>.*?</parameter>)*\s*", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>", re.DOTALL)
_QWEN_STRING_LENGTH = 200  # a string parameter's most characters in a forced call, when its schema sets none


def _parse_qwen3_coder(text: str, schemas: _Schemas) -> tuple[str, list[ToolCall]]:
    found = list(_QWEN_CALL.finditer(text))
    if len(found) != text.count("<tool_call>"):  # one not closed, or not a function
        raise _Malformed
    calls = []
    for match in found:
        name, body = match.group(1).strip(), match.group(2)
        if not _QWEN_PARAMETERS.fullmatch(body):
            raise _Malformed
        properties = schemas.get(name, {}).get("properties") or {}
        arguments = {
            parameter: _typed_value(value, properties.get(parameter, {}))
            for parameter, value in ((p.group(1).strip(), p.group(2)) for p in _QWEN_PARAMETER.finditer(body))
        }
        calls.append(_tool_call(name, arguments))
    return (text[: found[0].start()] if found else text), calls


def _schema_type(schema: Any) -> str | None:
    """The JSON type a property's schema gives (the first other than null of a list), or None."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def _typed_value(value: str, schema: dict[str, Any]) -> Any:
    """A qwen3_coder parameter's text as the type its schema gives (``null`` as None, a boolean
    in any case); kept as text when it is not one, or is a string's.

    Example:
        >>> _typed_value("3", {"type": "integer"}), _typed_value("3", {"type": "string"}), _typed_value("no", {})
        (3, '3', 'no')
    """
    kind = _schema_type(schema)
    if kind == "string":
        return value
    text = value.strip().lower() if kind == "boolean" else value.strip()
    try:
        typed = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return value
    if typed is None or kind not in _PYTHON_TYPES:  # null, or any JSON for a property of no known type
        return typed
    is_kind = isinstance(typed, _PYTHON_TYPES[kind]) and (kind == "boolean" or not isinstance(typed, bool))
    return typed if is_kind else value


_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list
}  # fmt: skip


def _not_json(constant: str) -> Any:
    """NaN and Infinity, which Python's json reads but JSON has not."""
    raise ValueError(constant)


def _qwen3_coder_grammar(functions: list[dict[str, Any]]) -> str:
    """Each function's call with its required parameters, then its optional ones (each may be
    left out), in the schema's order; a string's value is text without ``<`` or a newline."""
    rules = [f"start: {' | '.join(f'call{i}' for i in range(len(functions)))}"]
    for i, function in enumerate(functions):
        parameters = _parameters(function)
        properties = parameters.get("properties") or {}
        required = parameters.get("required") or []
        ordered = [*properties, *(name for name in required if name not in properties)]
        names = [n for n in ordered if n in required] + [n for n in ordered if n not in required]
        steps = []
        for j, name in enumerate(names):
            steps.append(f"param{i}_{j}" + ("" if name in required else "?"))
            opening = json.dumps(f"<parameter={name}>\n")
            rules.append(f'param{i}_{j}: {opening} value{i}_{j} "\\n</parameter>\\n"')
            rules.append(f"value{i}_{j}: {_qwen_value_rule(properties.get(name, {}))}")
        opening = json.dumps(f"<tool_call>\n<function={function['name']}>\n")
        rules.append(f'call{i}: {opening} {" ".join(steps)} "</function>\\n</tool_call>"')
    return "\n".join(rules) + "\n"


def _qwen_value_rule(schema: dict[str, Any]) -> str:
    """A parameter's value: a string unquoted (one of its ``enum``, or ``minLength`` to
    ``maxLength`` characters; its ``pattern`` or ``format`` is not held to), anything else as
    JSON valid against its schema."""
    if _schema_type(schema) != "string":
        return _json_rule(schema)
    if "enum" in schema:
        return " | ".join(json.dumps(option) for option in schema["enum"])
    shortest, longest = schema.get("minLength", 0), schema.get("maxLength", _QWEN_STRING_LENGTH)
    return f"/[^<\\n]{{{shortest},{longest}}}/"


class _Format(NamedTuple):
    parse: Callable[[str, _Schemas], tuple[str, list[ToolCall]]]  # content before the calls, calls
    grammar: Callable[[list[dict[str, Any]]], str]  # the Lark grammar of one call of the functions
    markers: tuple[str, ...]  # what the first call begins with: no content is read past one
    object_first: bool = False  # a text whose first character is "{" is a call


_FORMATS = {
    "hermes": _Format(_parse_hermes, _hermes_grammar, ("<tool_call>",)),
    "llama3_json": _Format(_parse_llama3_json, _llama3_json_grammar, (_PYTHON_TAG,), object_first=True),
    "mistral": _Format(_parse_mistral, _mistral_grammar, (_TOOL_CALLS,)),
    "qwen3_coder": _Format(_parse_qwen3_coder, _qwen3_coder_grammar, ("<tool_call>",)),
}
TOOL_CALL_PARSERS = tuple(_FORMATS)


class ToolCallGate:
    """The content of an answer with tools, sent while it streams: text goes out as it comes
    until something that may begin a call (a marker of the format, or part of one at the end so
    far), and whitespace is held until text follows it; past a marker everything is held until
    the answer is whole and `parse_tool_calls` has read it. What went out is always the start of
    the content the whole answer parses to, so `finish` gives the rest and a streamed answer
    reassembles to the unstreamed one, as vLLM and Dynamo stream text before a call.

    Example:
        >>> gate = ToolCallGate("hermes")
        >>> [gate.feed(piece) for piece in ["Adding ", "now. <tool", '_call>{"name": "add", ', '"arguments": {}}</tool_call>']]
        ['Adding', ' now.', '', '']
        >>> content, calls = parse_tool_calls(gate.text, "hermes")
        >>> gate.finish(content), [call.name for call in calls]
        ('', ['add'])
    """

    def __init__(self, parser: str) -> None:
        """``parser``: the format, one of `TOOL_CALL_PARSERS`."""
        self._format = _FORMATS[parser]
        self._longest = max(len(marker) for marker in self._format.markers)
        self._pieces: list[str] = []  # the answer so far (`text` joins them)
        self._unsent = ""  # the text after what went out: held whitespace, the start of a marker
        self._sent = 0  # characters of the text sent as content
        self._holding = False  # a call may have begun: nothing more goes out until the end
        self._begun = False  # the text's first character other than whitespace has come

    @property
    def text(self) -> str:
        """The answer so far."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def feed(self, piece: str) -> str:
        """What of the answer, ``piece`` added, may go out as content now ("" for nothing)."""
        self._pieces.append(piece)
        if self._holding:
            return ""
        pending = self._unsent + piece  # only what has not gone out is searched: linear in the answer
        if self._format.object_first and not self._begun:
            first = pending.lstrip()[:1]
            if not first:
                self._unsent = pending
                return ""  # the first character may yet be a call's "{"
            self._begun = True
            if first == "{":
                self._holding = True
                return ""
        boundary = len(pending)
        for marker in self._format.markers:
            found = pending.find(marker)
            if found >= 0:
                boundary = min(boundary, found)
                self._holding = True
        if not self._holding:
            boundary -= self._partial_marker(pending)
        end = boundary
        while end > 0 and pending[end - 1].isspace():
            end -= 1
        self._unsent = pending[end:]
        self._sent += end
        return pending[:end]

    def finish(self, content: str | None) -> str:
        """The rest of ``content`` (what `parse_tool_calls` read from `text`) after what went out."""
        return (content or "")[self._sent :]

    def _partial_marker(self, text: str) -> int:
        """How many characters at the end of ``text`` are the beginning of a marker."""
        for length in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-length:]
            if any(marker.startswith(tail) for marker in self._format.markers):
                return length
        return 0
