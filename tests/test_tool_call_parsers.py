"""The tool call parsers (``--tool-call-parser`` hermes, llama3_json, mistral, qwen3_coder) on
their formats' own examples and on malformed output (which stays text), the qwen3_coder
parameters' types, and each format's forced-call grammar, compiled by llguidance as the kit
compiles it (`GuidedDecoding`): it takes a valid call in the format, refuses an invalid one,
and what it lets a (random) model write parses back to a call valid against the tool's schema.
Pure unit tests: no servers, no model (a byte-level tokenizer drives llguidance)."""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

import jsonschema
import pytest

from dynamo_nb.llm.guided import GuidedDecoding
from dynamo_nb.llm.tool_calls import TOOL_CALL_PARSERS, forced_tool_grammar, parse_tool_calls

llguidance = pytest.importorskip("llguidance")

ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
SHOUT = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 6}}, "required": ["text"],
         "additionalProperties": False}  # fmt: skip
STEP = {"type": "object", "properties": {"do": {"type": "string", "maxLength": 8}, "minutes": {"type": "number",
        "minimum": 0}}, "required": ["do"], "additionalProperties": False}  # fmt: skip
PLAN = {
    "type": "object",
    "properties": {
        "urgent": {"type": "boolean"},
        "title": {"type": "string", "minLength": 1, "maxLength": 12},
        "steps": {"type": "array", "items": STEP, "maxItems": 3},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["title", "steps"],
    "additionalProperties": False,
}
SCHEMAS = {"add": ADD, "shout": SHOUT, "plan": PLAN}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()
]


def calls_of(
    text: str, parser: str, tools: list[dict[str, Any]] | None = TOOLS
) -> tuple[str | None, list[Any]]:
    """The content and the (name, arguments) of each call `parse_tool_calls` reads."""
    content, calls = parse_tool_calls(text, parser, tools=tools)
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


EXAMPLES = [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "Sure.",
     [("add", {"a": 1, "b": 2})]),
    ("hermes", '<tool_call>{"name": "shout", "arguments": {"text": "héllo ✓"}}</tool_call>\n'
     '<tool_call>{"name": "plan", "arguments": {"title": "x", "steps": [{"do": "a", "minutes": 1.5}]}}</tool_call>',
     None, [("shout", {"text": "héllo ✓"}), ("plan", {"title": "x", "steps": [{"do": "a", "minutes": 1.5}]})]),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),
    ("llama3_json", ' \n{"name": "add", "arguments": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "shout", "parameters": {"text": "日本"}}',
     None, [("add", {"a": 1, "b": 2}), ("shout", {"text": "日本"})]),
    ("llama3_json", 'Let me plan.<|python_tag|>{"name": "plan", "parameters": {"title": "t", "steps": [{"do": "go"}]}}',
     "Let me plan.", [("plan", {"title": "t", "steps": [{"do": "go"}]})]),
    ("llama3_json", '{"name": "ping"}', None, [("ping", {})]),
    ("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]', None, [("add", {"a": 1, "b": 2})]),
    ("mistral", 'On it.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "shout", "arguments": '
     '{"text": "ça"}}]', "On it.", [("add", {"a": 1, "b": 2}), ("shout", {"text": "ça"})]),
    ("mistral", 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]plan[ARGS]{"title": "t", "steps": '
     '[{"do": "é", "minutes": 2}]}', "Sure.",
     [("add", {"a": 1, "b": 2}), ("plan", {"title": "t", "steps": [{"do": "é", "minutes": 2}]})]),
    ("qwen3_coder", "Adding.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n"
     "</parameter>\n</function>\n</tool_call>", "Adding.", [("add", {"a": 1, "b": 2})]),
    ("qwen3_coder", "<tool_call>\n<function=shout>\n<parameter=text>\nhi\nthere 日本\n</parameter>\n</function>\n"
     "</tool_call>\n<tool_call>\n<function=plan>\n<parameter=title>\n42\n</parameter>\n<parameter=steps>\n"
     '[{"do": "x", "minutes": 1}]\n</parameter>\n<parameter=urgent>\ntrue\n</parameter>\n</function>\n</tool_call>',
     None, [("shout", {"text": "hi\nthere 日本"}),
            ("plan", {"title": "42", "steps": [{"do": "x", "minutes": 1}], "urgent": True})]),
    ("qwen3_coder", "<tool_call>\n<function=ping>\n</function>\n</tool_call>", None, [("ping", {})]),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "text", "content", "calls"), EXAMPLES)
def test_each_parser_reads_its_formats_examples(
    parser: str, text: str, content: str | None, calls: list[Any]
) -> None:
    assert calls_of(text, parser) == (content, calls)


MALFORMED = [
    ("hermes", '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>'),
    ("llama3_json", "Just text, no call."),
    ("llama3_json", 'The call would be {"name": "add", "parameters": {"a": 1, "b": 2}}'),  # not at the start
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}'),
    ("llama3_json", '<|python_tag|>{"parameters": {"a": 1}}'),
    ("llama3_json", '{"name": "add", "parameters": [1, 2]}'),
    ("llama3_json", '{"name": 7, "parameters": {}}'),
    ("llama3_json", '{"name": "add", "parameters": {}} {"name": "shout", "parameters": {}}'),  # no "; "
    ("llama3_json", '{"name": "add", "parameters": {}}; and some words'),
    ("llama3_json", '<|python_tag|>[{"name": "add", "parameters": {}}]'),
    ("mistral", "No call here."),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}'),
    ("mistral", '[TOOL_CALLS][{"arguments": {"a": 1}}]'),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": [1]}]'),
    ("mistral", '[TOOL_CALLS]{"name": "add", "arguments": {}}'),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": }'),
    ("mistral", '[TOOL_CALLS][ARGS]{"a": 1}'),
    ("mistral", "[TOOL_CALLS]add[ARGS][1, 2]"),
    ("mistral", "[TOOL_CALLS][]"),
    ("qwen3_coder", "No call here."),
    ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>"),
    ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=>\n</function>\n</tool_call>"),
    ("qwen3_coder", '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=add>\nloose words\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "text"), MALFORMED)
def test_malformed_output_stays_text_with_no_calls(parser: str, text: str) -> None:
    assert parse_tool_calls(text, parser, tools=TOOLS) == (text, [])


@pytest.mark.parametrize("parser", TOOL_CALL_PARSERS)
def test_calls_get_distinct_ids_and_json_arguments(parser: str) -> None:
    text = forced_text(parser, "add", {"a": 1, "b": 2})
    _, calls = parse_tool_calls(text + "\n" + text if parser != "llama3_json" else f"{text}; {text}", parser)
    assert len(calls) == 2 and calls[0].id != calls[1].id and all(c.id.startswith("call_") for c in calls)
    assert [json.loads(call.arguments) for call in calls] == [{"a": 1, "b": 2}] * 2


def test_an_unknown_parser_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown tool call parser 'pythonic'"):
        parse_tool_calls("text", "pythonic")
    with pytest.raises(ValueError, match="unknown tool call parser"):
        forced_tool_grammar(TOOLS, "required", "pythonic")


TYPED = {"type": "object", "properties": {
    "count": {"type": "integer"}, "ratio": {"type": "number"}, "whole": {"type": "number"}, "flag": {"type": "boolean"},
    "options": {"type": "object"}, "items": {"type": "array"}, "name": {"type": "string"}, "maybe": {"type": ["integer", "null"]},
    "nothing": {"type": "integer"}, "loose": {}, "word": {}, "bad_int": {"type": "integer"}, "bad_flag": {"type": "boolean"},
    "nan": {"type": "number"}, "null_text": {"type": "string"}, "truth": {"type": "integer"},
}}  # fmt: skip
VALUES = {
    "count": ("42", 42), "ratio": ("2.5", 2.5), "whole": ("3", 3), "flag": ("True", True),
    "options": ('{"k": [1, {"é": null}]}', {"k": [1, {"é": None}]}), "items": ("[1, 2]", [1, 2]), "name": ("42", "42"),
    "maybe": ("7", 7), "nothing": ("null", None), "loose": ("[true]", [True]), "word": ("hello there", "hello there"),
    "bad_int": ("4.5", "4.5"), "bad_flag": ("yes", "yes"), "nan": ("NaN", "NaN"), "null_text": ("null", "null"),
    "truth": ("true", "true"),
}  # fmt: skip


def test_qwen3_coder_values_take_the_type_the_tools_schema_gives() -> None:
    parameters = "".join(f"<parameter={name}>\n{text}\n</parameter>\n" for name, (text, _) in VALUES.items())
    text = f"<tool_call>\n<function=typed>\n{parameters}</function>\n</tool_call>"
    typed = [{"type": "function", "function": {"name": "typed", "parameters": TYPED}}]
    _, calls = calls_of(text, "qwen3_coder", typed)
    assert calls == [("typed", {name: value for name, (_, value) in VALUES.items()})]
    _, untyped = calls_of(text, "qwen3_coder", None)  # no tools: JSON when it is, else the text
    assert untyped[0][1]["count"] == 42 and untyped[0][1]["name"] == 42 and untyped[0][1]["flag"] == "True"
    assert untyped[0][1]["word"] == "hello there" and untyped[0][1]["null_text"] is None


# The forced-call grammars, driven through llguidance by a byte-level tokenizer (one token a byte).


class _Bytes:
    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]  # \xff: a special token, not text
    special_token_ids: ClassVar = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def matcher(tool_choice: Any, parser: str, tools: list[dict[str, Any]] = TOOLS) -> Any:
    """A matcher at the start of the forced-call grammar, compiled as the kit compiles it."""
    guided = GuidedDecoding("grammar", forced_tool_grammar(tools, tool_choice, parser), "tool_choice")
    guided.check()
    return llguidance.LLMatcher(TOKENIZER, guided.grammar())


def accepts(tool_choice: Any, parser: str, text: str, tools: list[dict[str, Any]] = TOOLS) -> bool:
    """Whether the grammar takes all of ``text`` and is then complete."""
    m, tokens = matcher(tool_choice, parser, tools), list(text.encode())
    return m.validate_tokens(tokens) == len(tokens) and m.consume_tokens(tokens) and m.is_accepting()


def sample(tool_choice: Any, parser: str, seed: int) -> str:
    """What a random model writes under the grammar (closing characters favoured, so it ends)."""
    rng, m, out = random.Random(seed), matcher(tool_choice, parser), bytearray()
    for _ in range(5000):
        mask = m.compute_bitmask()
        allowed = [t for t in range(257) if mask[t // 8] >> (t % 8) & 1]
        if _Bytes.eos_token_id in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            return out.decode()
        closers = [t for t in allowed if t in b'"]}\n<']
        token = rng.choice(closers if closers and rng.random() < 0.3 else [t for t in allowed if t != 256])
        assert m.consume_token(token), m.get_error()
        out.append(token)
    raise AssertionError(f"the grammar did not end: {out.decode(errors='replace')!r}")


def forced_text(parser: str, name: str, arguments: dict[str, Any]) -> str:
    """A call as the forced grammar writes it: its arguments in the schema's order (qwen3_coder's:
    the required ones first), compact JSON (qwen3_coder's values as text)."""
    schema = SCHEMAS.get(name, {})
    order = list(schema.get("properties", {}))
    if parser == "qwen3_coder":
        order.sort(key=lambda p: p not in schema.get("required", []))
    arguments = dict(
        sorted(arguments.items(), key=lambda item: order.index(item[0]) if item[0] in order else 0)
    )
    compact = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    if parser == "hermes":
        return f'<tool_call>\n{{"name":"{name}","arguments":{compact}}}\n</tool_call>'
    if parser == "llama3_json":
        return f'{{"name":"{name}","parameters":{compact}}}'
    if parser == "mistral":
        return f'[TOOL_CALLS][{{"name":"{name}","arguments":{compact}}}]'
    values = (v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in arguments.values())
    parameters = "".join(
        f"<parameter={p}>\n{v}\n</parameter>\n" for p, v in zip(arguments, values, strict=True)
    )
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


NAMED_ADD = {"type": "function", "function": {"name": "add"}}
VALID_PLAN = {"title": "trip ✓", "steps": [{"do": "pack", "minutes": 1.5}], "urgent": True, "unit": "celsius"}


@pytest.mark.parametrize("parser", TOOL_CALL_PARSERS)
def test_the_forced_grammar_takes_a_valid_call_in_its_format(parser: str) -> None:
    assert accepts(NAMED_ADD, parser, forced_text(parser, "add", {"a": 2, "b": 3}))
    assert accepts("required", parser, forced_text(parser, "plan", VALID_PLAN))
    assert accepts("required", parser, forced_text(parser, "shout", {"text": "hé"}))


@pytest.mark.parametrize("parser", TOOL_CALL_PARSERS)
@pytest.mark.parametrize(
    ("tool_choice", "name", "arguments"),
    [
        (NAMED_ADD, "add", {"a": 2, "b": 100}),  # out of range
        (NAMED_ADD, "add", {"a": 2}),  # b is required
        (NAMED_ADD, "shout", {"text": "hi"}),  # not the named function
        ("required", "shout", {"text": "too long"}),  # over maxLength
        ("required", "nope", {}),  # not a tool
        ("required", "plan", {"title": "t", "steps": [{"minutes": 1}]}),  # a step without "do"
        ("required", "plan", {"title": "t", "steps": [], "unit": "kelvin"}),  # not in the enum
    ],
)
def test_the_forced_grammar_refuses_an_invalid_call(
    parser: str, tool_choice: Any, name: str, arguments: dict[str, Any]
) -> None:
    assert not accepts(tool_choice, parser, forced_text(parser, name, arguments))


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'),  # free whitespace
        ("hermes", '{"name":"add","arguments":{"a":2,"b":3}}'),  # no tags
        ("llama3_json", '{"name":"add","arguments":{"a":2,"b":3}}'),  # "parameters" is this format's key
        ("mistral", '[TOOL_CALLS][{"name":"add","arguments":{"a":2,"b":3}},{"name":"add","arguments":{"a":2,"b":3}}]'),
        ("mistral", '[TOOL_CALLS]add[ARGS]{"a":2,"b":3}'),  # the forced form is the list
        ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=b>\n3\n</parameter>\n<parameter=a>\n2\n"
         "</parameter>\n</function>\n</tool_call>"),  # required parameters in the schema's order
        ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n\"2\"\n</parameter>\n<parameter=b>\n3\n"
         "</parameter>\n</function>\n</tool_call>"),  # a quoted integer
    ],
)  # fmt: skip
def test_the_forced_grammar_holds_to_its_formats_exact_shape(parser: str, text: str) -> None:
    assert not accepts(NAMED_ADD, parser, text)


def test_the_qwen3_coder_grammar_has_optional_parameters_after_the_required_ones_and_bare_strings() -> None:
    def plan(*parameters: str) -> str:
        return f"<tool_call>\n<function=plan>\n{''.join(parameters)}</function>\n</tool_call>"

    title, steps = "<parameter=title>\nA trip\n</parameter>\n", "<parameter=steps>\n[]\n</parameter>\n"
    urgent, unit = "<parameter=urgent>\nfalse\n</parameter>\n", "<parameter=unit>\nfahrenheit\n</parameter>\n"
    assert accepts("required", "qwen3_coder", plan(title, steps))
    assert accepts("required", "qwen3_coder", plan(title, steps, urgent, unit))
    assert accepts("required", "qwen3_coder", plan(title, steps, unit))
    assert not accepts("required", "qwen3_coder", plan(title, steps, unit, urgent))  # the schema's order
    assert not accepts("required", "qwen3_coder", plan(steps, title))
    empty, too_long = (
        "<parameter=title>\n\n</parameter>\n",
        "<parameter=title>\n13 characters\n</parameter>\n",
    )
    assert not accepts("required", "qwen3_coder", plan(empty, steps))  # minLength 1
    assert accepts("required", "qwen3_coder", plan('<parameter=title>\n"12 chars"  \n</parameter>\n', steps))
    assert not accepts("required", "qwen3_coder", plan(too_long, steps))  # maxLength 12
    assert not accepts("required", "qwen3_coder", plan("<parameter=title>\na<b\n</parameter>\n", steps))


def test_a_tool_without_parameters_is_forced_with_an_empty_call() -> None:
    ping = [{"type": "function", "function": {"name": "ping"}}]
    for parser, text in [("qwen3_coder", "<tool_call>\n<function=ping>\n</function>\n</tool_call>"),
                         ("llama3_json", '{"name":"ping","parameters":{}}')]:  # fmt: skip
        assert accepts("required", parser, text, ping)
        assert calls_of(text, parser, ping) == (None, [("ping", {})])
    assert not accepts("required", "qwen3_coder", "<tool_call>\n<function=ping>\n<parameter=x>\n1\n</parameter>\n"
                       "</function>\n</tool_call>", ping)  # fmt: skip


@pytest.mark.parametrize("parser", TOOL_CALL_PARSERS)
def test_what_the_forced_grammar_lets_a_model_write_parses_back_to_a_valid_call(parser: str) -> None:
    names = set()
    for seed in range(12):
        text = sample("required", parser, seed)
        content, calls = calls_of(text, parser)
        assert content is None and len(calls) == 1, text
        name, arguments = calls[0]
        jsonschema.validate(arguments, SCHEMAS[name])
        names.add(name)
    assert len(names) > 1  # the grammar lets any of the tools be called
    for seed in range(4):
        content, calls = calls_of(sample(NAMED_ADD, parser, seed), parser)
        assert [name for name, _ in calls] == ["add"]
        jsonschema.validate(calls[0][1], ADD)
