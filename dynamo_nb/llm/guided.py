"""Structured output: what a request's output must match, from OpenAI's and vLLM's fields to a
grammar an engine enforces token by token.

A request asks for it with OpenAI's ``response_format`` (``{"type": "json_object"}``, or
``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``) or with vLLM's
structured outputs under ``nvext.structured_outputs`` (exactly one of ``json`` (a schema),
``regex``, ``choice`` (a list of strings) or ``grammar`` (Lark, as llguidance reads it)).
`GuidedDecoding.from_openai` reads them (a 400 naming the field for anything else), and
`GuidedDecoding.grammar` is the llguidance grammar that enforces it (JSON without free
whitespace, as ``json.dumps(value, separators=(",", ":"))`` writes it: a small model would pad); `GuidedDecoding.check`
compiles it once at the frontend, so a schema the library cannot compile is a 400 naming the
field before any worker is asked. It travels to the worker in the `PreprocessedRequest`
(``guided_decoding``), with ``generated``: the output tokens already made under it (a stream
that moved to another worker continues its grammar's state from there).

Example:
    >>> guided = GuidedDecoding.from_openai({"response_format": {"type": "json_object"}})
    >>> guided.kind, guided.spec
    ('json', {'type': 'object'})
    >>> GuidedDecoding.from_openai({"nvext": {"structured_outputs": {"choice": ["yes", "no"]}}}).kind
    'choice'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidRequestError

__all__ = ["GUIDED_KINDS", "GuidedDecoding"]

GUIDED_KINDS = ("json", "regex", "choice", "grammar")
_WHERE = {  # the request field each kind comes from, for messages
    "json": "nvext.structured_outputs.json",
    "regex": "nvext.structured_outputs.regex",
    "choice": "nvext.structured_outputs.choice",
    "grammar": "nvext.structured_outputs.grammar",
}


@dataclass(frozen=True)
class GuidedDecoding:
    """What the output must match (see the module docstring).

    Attributes:
        kind: ``json`` (``spec`` a JSON schema), ``regex``, ``choice`` (``spec`` a list of
            strings) or ``grammar`` (``spec`` a Lark grammar).
        field: the request field it came from (for error messages).
        generated: output tokens already made under it (a continued stream's).
    """

    kind: str
    spec: Any
    field: str = ""
    generated: int = 0

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> GuidedDecoding | None:
        """The structured output an OpenAI body asks for (None: none), its shape checked."""
        from_format = _from_response_format(body.get("response_format"))
        nvext = body.get("nvext")
        asked = nvext.get("structured_outputs") if isinstance(nvext, dict) else None
        from_nvext = _from_structured_outputs(asked) if asked is not None else None
        if from_format is not None and from_nvext is not None:
            raise InvalidRequestError(
                "give response_format or nvext.structured_outputs, not both", "response_format"
            )
        return from_format or from_nvext

    @classmethod
    def parse(cls, data: Any) -> GuidedDecoding:
        """The wire form (`to_dict`) read back, as a worker receives it."""
        if not isinstance(data, dict) or data.get("kind") not in GUIDED_KINDS or "spec" not in data:
            raise InvalidRequestError(
                f"guided_decoding must be {{'kind': one of {', '.join(GUIDED_KINDS)}, 'spec': ...}}",
                "guided_decoding",
            )
        generated = data.get("generated", 0)
        if not isinstance(generated, int) or generated < 0:
            raise InvalidRequestError("guided_decoding.generated must be a count ≥ 0", "guided_decoding")
        return cls(data["kind"], data["spec"], str(data.get("field") or ""), generated)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "spec": self.spec}
        if self.field:
            out["field"] = self.field
        if self.generated:
            out["generated"] = self.generated
        return out

    def continued(self, tokens: int) -> GuidedDecoding:
        """The same constraint after ``tokens`` more output tokens were made under it."""
        return replace(self, generated=self.generated + tokens)

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form) that enforces this.

        Example:
            >>> '"json_schema"' in GuidedDecoding("json", {"type": "object"}).grammar()
            True
        """
        from llguidance import LLMatcher

        if self.kind == "json":  # compact JSON (no free whitespace: a small model would pad forever)
            return LLMatcher.grammar_from_json_schema(self.spec, overrides={"whitespace_flexible": False})
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            return LLMatcher.grammar_from_regex("|".join(f"({re.escape(option)})" for option in self.spec))
        return LLMatcher.grammar_from_lark(self.spec)

    def check(self) -> None:
        """Compile the grammar once; a `InvalidRequestError` naming the field when it does not."""
        try:
            from llguidance import LLMatcher
        except ImportError:
            raise InvalidRequestError(
                f"{self.field or _WHERE[self.kind]}: structured output needs llguidance in the frontend's "
                "environment (pip install llguidance)",
                self.field or _WHERE[self.kind],
            ) from None
        try:
            error = LLMatcher.validate_grammar(self.grammar())
        except Exception as exc:  # llguidance raises for some malformed input instead of saying so
            error = str(exc)
        if error:
            where = self.field or _WHERE[self.kind]
            raise InvalidRequestError(f"{where} cannot be compiled into a grammar: {error}", where)


def _from_response_format(response_format: Any) -> GuidedDecoding | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequestError(
            "response_format must be an object: {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}",
            "response_format",
        )
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecoding("json", {"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise InvalidRequestError(
                "response_format.json_schema must be {'name': ..., 'schema': {...}, 'strict': true}",
                "response_format.json_schema",
            )
        schema = spec.get("schema") or {}
        return GuidedDecoding("json", schema, "response_format.json_schema.schema")
    raise InvalidRequestError(
        f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format.type"
    )


def _from_structured_outputs(asked: Any) -> GuidedDecoding:
    if not isinstance(asked, dict):
        raise InvalidRequestError(
            "nvext.structured_outputs must be an object with one of json, regex, choice, grammar",
            "nvext.structured_outputs",
        )
    given = [kind for kind in GUIDED_KINDS if asked.get(kind) is not None]
    unknown = sorted(set(asked) - set(GUIDED_KINDS))
    if unknown or len(given) != 1:
        raise InvalidRequestError(
            f"nvext.structured_outputs takes exactly one of {', '.join(GUIDED_KINDS)}"
            + (f" (not {unknown[0]!r})" if unknown else f", got {len(given)}"),
            "nvext.structured_outputs",
        )
    kind = given[0]
    spec = asked[kind]
    where = _WHERE[kind]
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError:
                raise InvalidRequestError(f"{where} must be a JSON schema (an object)", where) from None
        if not isinstance(spec, dict):
            raise InvalidRequestError(f"{where} must be a JSON schema (an object)", where)
    elif kind == "choice":
        if (
            not isinstance(spec, list)
            or not spec
            or not all(isinstance(option, str) and option for option in spec)
        ):
            raise InvalidRequestError(f"{where} must be a non-empty list of non-empty strings", where)
    elif not isinstance(spec, str) or not spec:
        raise InvalidRequestError(f"{where} must be a non-empty string", where)
    return GuidedDecoding(kind, spec, where)
