"""Tool calls in a model's text, and the grammar that forces one.

A chat template renders a request's ``tools`` (the built-in tiny model's does, Hermes style:
signatures in ``<tools></tools>``, a call written as ``<tool_call>{"name", "arguments"}</tool_call>``,
a result given back in ``<tool_response>``). `parse_tool_calls` reads the calls out of what the
model wrote, in the format ``--tool-call-parser`` names (`TOOL_CALL_PARSERS`, as vLLM and
Dynamo name them): the text before the first call is the message's content; output that does
not parse stays text. `forced_tool_grammar` is the grammar (llguidance's Lark) for
``tool_choice`` ``required`` or a named function: exactly one call of one of the tools, its
``arguments`` valid against the tool's ``parameters`` schema, so any model returns a valid call.

Example:
    >>> content, calls = parse_tool_calls('Sure.<tool_call>\\n{"name": "add", "arguments": {"a": 2}}\\n</tool_call>')
    >>> content, calls[0].name, calls[0].arguments
    ('Sure.', 'add', '{"a": 2}')
    >>> parse_tool_calls("<tool_call>not json</tool_call>")[1]
    []
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequestError
from ..runtime.ids import new_request_id

__all__ = ["TOOL_CALL_PARSERS", "ToolCall", "check_tools", "forced_tool_grammar", "parse_tool_calls"]

TOOL_CALL_PARSERS = ("hermes",)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


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


def parse_tool_calls(text: str, parser: str = "hermes") -> tuple[str | None, list[ToolCall]]:
    """The content before the calls (None when there is none) and the calls in ``text``; a call
    that does not parse leaves the whole text as content and no calls."""
    if parser not in TOOL_CALL_PARSERS:
        raise ValueError(f"unknown tool call parser {parser!r}: use one of {', '.join(TOOL_CALL_PARSERS)}")
    found = list(_HERMES.finditer(text))
    if not found:
        return text, []
    calls = []
    for match in found:
        try:
            data = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return text, []
        arguments = data.get("arguments", {})
        calls.append(ToolCall(data["name"], json.dumps(arguments), "call_" + new_request_id()[:24]))
    content = text[: found[0].start()].strip()
    return content or None, calls


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


def forced_tool_grammar(tools: list[dict[str, Any]], tool_choice: Any) -> str:
    """The Lark grammar (llguidance's) of one call in the Hermes format: of the function
    ``tool_choice`` names, or of any of ``tools`` (``required``)."""
    functions = [tool["function"] for tool in tools]
    if isinstance(tool_choice, dict):
        functions = [f for f in functions if f["name"] == tool_choice["function"]["name"]]
    schemas = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
    return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {json.dumps(schema)}\n'
