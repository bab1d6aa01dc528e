"""Property-based fuzzing of an OpenAI-compatible HTTP API (needs ``hypothesis``, in the dev extra).

`request_bodies` generates chat and completion requests: mostly well-formed around a model's
name with fields of every JSON type and range (wrong roles, missing content, NaN temperatures,
huge seeds, long stop lists, prompts as text, token ids or batches, text with lone surrogates),
plus arbitrary JSON and raw bytes. `check_answer` says what is wrong with one answer: a 5xx, an error body outside
OpenAI's envelope, a 200 that is not a completion or an SSE stream ending in ``[DONE]``.
`fuzz` sends ``examples`` of them to a running server and counts what came back.

Example::

    from dynamo_nb.bench import fuzz
    report = fuzz.fuzz("http://127.0.0.1:8000", "tiny-llama", examples=500)
    report["problems"]  # [] when every answer was a 2xx completion or a 4xx in the envelope
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["check_answer", "fuzz", "request_bodies"]

PATHS = ("/v1/chat/completions", "/v1/completions")


def request_bodies(model: str) -> Any:
    """A hypothesis strategy of ``(path, body bytes)`` aimed at ``model``'s endpoints: valid
    requests, valid requests with one field replaced by any JSON value (or dropped), requests
    whose every field may be anything, arbitrary JSON, and raw bytes.

    Example::

        from hypothesis import given
        @given(fuzz.request_bodies("tiny-llama"))
        def test_api(case): path, body = case; ...
    """
    from hypothesis import strategies as st

    # text as JSON allows it: any code point, lone surrogates too (hypothesis leaves those out
    # by default), beside plain text; a lone surrogate must be a 400, as any other bad field
    any_text = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(
        ["\ud800", "a\udfffb", "\udc80\udc80", "\ud83d", "\ud83d\ude00"]
    )
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=12)
        | any_text
    )
    anything = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=8,
    )
    words = st.text(min_size=1, max_size=40) | any_text.filter(bool)
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": words}
    ) | st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": words}), min_size=1, max_size=2
            ),
        }
    )
    valid_fields = {
        "max_tokens": st.integers(1, 24),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "top_k": st.sampled_from([-1, 1, 5, 50]),
        "seed": st.integers(0, 2**32),
        "stop": words | st.lists(words, min_size=1, max_size=4),
        "stream": st.booleans(),
        "ignore_eos": st.booleans(),
        "min_tokens": st.integers(0, 1),
        "n": st.just(1),
        "user": words,
        "nvext": st.just({"extra_fields": ["worker_id"]}),
    }
    chat = st.fixed_dictionaries(
        {"model": st.just(model), "messages": st.lists(message, min_size=1, max_size=3)},
        optional=valid_fields,
    )
    completion = st.fixed_dictionaries(
        {"model": st.just(model), "prompt": words | st.lists(st.integers(0, 511), min_size=1, max_size=8)},
        optional=valid_fields,
    )
    valid = st.tuples(st.just(PATHS[0]), chat) | st.tuples(st.just(PATHS[1]), completion)
    field_names = sorted(
        {"model", "messages", "prompt", "stream_options", "logprobs", "logit_bias", *valid_fields}
    )

    @st.composite
    def one_field_changed(draw: Any) -> tuple[str, Any]:
        path, body = draw(valid)
        name = draw(st.sampled_from(field_names))
        if draw(st.booleans()) and name in body:
            del body[name]
        else:
            body[name] = draw(anything)
        return path, body

    loose = st.tuples(
        st.sampled_from(PATHS), st.dictionaries(st.sampled_from(field_names), anything, max_size=6)
    )
    as_json = st.one_of(
        valid, one_field_changed(), one_field_changed(), loose, st.tuples(st.sampled_from(PATHS), anything)
    )
    encoded = as_json.map(lambda case: (case[0], json.dumps(case[1]).encode()))
    raw = st.tuples(st.sampled_from(PATHS), st.binary(max_size=64))
    return st.one_of(encoded, encoded, encoded, encoded, raw)


def check_answer(status: int, content_type: str, body: bytes) -> str | None:
    """What is wrong with one answer (None: nothing): a 5xx, a 4xx whose body is not OpenAI's
    error envelope, a 200 that is neither a completion object nor an SSE stream ending in
    ``data: [DONE]``.

    Example:
        >>> check_answer(400, "application/json", b'{"error": {"message": "m", "type": "t", "param": null, "code": 400}}')
        >>> check_answer(500, "application/json", b"{}")
        'status 500'
    """
    if status >= 500:
        return f"status {status}"
    if status >= 400:
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {status} without an error envelope: {body[:120]!r}"
        if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error["message"]:
            return f"status {status}: error without a message: {body[:120]!r}"
        if not {"type", "param", "code"} <= error.keys():
            return f"status {status}: error envelope lacks type/param/code: {body[:120]!r}"
        return None
    if status != 200:
        return f"unexpected status {status}"
    if content_type.startswith("text/event-stream"):
        events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "data: [DONE]":
            return f"an SSE stream that does not end in [DONE]: {body[-120:]!r}"
        if any('"error"' in line for line in events):
            return f"an SSE stream with an error event: {body[-200:]!r}"
        return None
    try:
        completion = json.loads(body)
    except ValueError:
        return f"a 200 that is not JSON: {body[:120]!r}"
    if not isinstance(completion, dict) or not completion.get("choices"):
        return f"a 200 without choices: {body[:120]!r}"
    return None


def fuzz(
    url: str, model: str, *, examples: int = 2000, seed: int | None = 0, timeout: float = 30.0
) -> dict[str, Any]:
    """Send ``examples`` generated requests to the server at ``url``; what came back.

    Returns ``{"examples", "statuses" (status → count), "problems" (the first 20, each with
    its request), "problem_count", "alive"}`` (``alive``: the server still answers ``/v1/models``
    after the run). ``seed`` makes the examples repeatable (None: new ones each run).
    """
    import httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed

    statuses: Counter[int] = Counter()
    problems: list[dict[str, Any]] = []
    count = 0
    with httpx.Client(base_url=url, timeout=timeout) as http:

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(request_bodies(model))
        def one(case: tuple[str, bytes]) -> None:
            nonlocal count
            path, body = case
            response = http.post(path, content=body, headers={"Content-Type": "application/json"})
            count += 1
            statuses[response.status_code] += 1
            problem = check_answer(
                response.status_code, response.headers.get("content-type", ""), response.content
            )
            if problem is not None:
                problems.append(
                    {"path": path, "body": body.decode(errors="replace")[:400], "problem": problem}
                )

        (fixed_seed(seed)(one) if seed is not None else one)()
        alive = http.get("/v1/models").status_code == 200
    return {
        "examples": count,
        "statuses": {str(status): n for status, n in sorted(statuses.items())},
        "problem_count": len(problems),
        "problems": problems[:20],
        "alive": alive,
    }
