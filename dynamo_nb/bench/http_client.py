"""One timed request to an OpenAI-compatible server: the per-request record of `bench.run`.

The stream is read in chunks as they arrive; every SSE event in a chunk gets the chunk's
arrival time. A content event (a non-empty ``delta.content`` or ``text``) is a token event:
the first gives TTFT, the gaps between them are the inter-token latencies. Usage (asked
for with ``stream_options.include_usage``) gives the token counts when the server sends
it, and ``nvext.worker_id`` (our frontend, and Dynamo's, when asked for it) the workers; our
frontend's ``x-dynamo-path`` header gives the disaggregated path (fast, fallback, aggregated).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from time import perf_counter
from typing import Any

from ..http.lean_client import HttpAnswer, LeanHttpClient

__all__ = ["RECORD_COLUMNS", "send_request", "text_pieces"]

RECORD_COLUMNS = [
    "label",
    "concurrency",
    "rate",
    "index",
    "prompt",
    "sent_s",
    "ttft_s",
    "e2e_s",
    "itl_s",
    "output_tokens",
    "input_tokens",
    "cached_tokens",
    "status",
    "error",
    "worker",
    "prefill_worker",
    "path",
    "request_id",
]
"""The DataFrame columns: times are seconds; ``sent_s`` counts from the start of the run;
``cached_tokens`` is the answer's ``usage.prompt_tokens_details.cached_tokens``, ``request_id``
its ``x-request-id`` header (our frontend's routing decisions are kept under it)."""

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def _error_text(status: int, raw: bytes) -> str:
    """``"404: model 'x' not found"`` from an OpenAI error envelope, or the start of the body."""
    try:
        body = json.loads(raw)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("error")
    except (ValueError, TypeError, KeyError, AttributeError):
        message = None
    return f"{status}: {message or raw[:200].decode(errors='replace').strip() or 'no body'}"


def _worker_ids(record: dict[str, Any], nvext: Any) -> None:
    info = nvext.get("worker_id") if isinstance(nvext, dict) else None
    if not isinstance(info, dict):
        return
    decode, prefill = info.get("decode_worker_id"), info.get("prefill_worker_id")
    if decode is not None:
        record["worker"] = f"{decode:x}" if isinstance(decode, int) else str(decode)
    if prefill is not None:
        record["prefill_worker"] = f"{prefill:x}" if isinstance(prefill, int) else str(prefill)
    if record["path"] is None and (record["worker"] is not None or record["prefill_worker"] is not None):
        disagg = record["prefill_worker"] is not None and record["prefill_worker"] != record["worker"]
        record["path"] = "disaggregated" if disagg else "aggregated"


def _usage(record: dict[str, Any], usage: dict[str, Any]) -> None:
    record["output_tokens"] = usage.get("completion_tokens")
    record["input_tokens"] = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        record["cached_tokens"] = details.get("cached_tokens")


_NEEDS_PARSING = re.compile(rb'"(?:usage|nvext|error)"')
_TEXT_KEY = re.compile(rb'"(?:content|text)":\s*')


def text_pieces(data: bytes) -> int | None:
    """How many choices of an SSE ``data`` payload carry text (a non-empty ``delta.content`` or
    ``text``), read from the bytes without decoding the JSON (a load generator decoding every
    token's JSON spent a fifth of its CPU there); None when the payload has more than tokens
    (usage, ``nvext``, an error) or is not an object, and must be decoded.

    A key is only a key when a quote opens it, so ``"reasoning_content"`` and escaped quotes
    inside a string do not count.

    Example:
        >>> text_pieces(b'{"choices":[{"index":0,"delta":{"content":"Hi"}}]}')
        1
        >>> text_pieces(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
        0
        >>> text_pieces(b'{"choices":[],"usage":{"completion_tokens":3}}') is None
        True
    """
    if data[:1] != b"{" or data[-1:] != b"}" or _NEEDS_PARSING.search(data) is not None:
        return None  # not an object (decoding says what is wrong), or more than tokens
    pieces = 0
    for match in _TEXT_KEY.finditer(data):
        end = match.end()
        if data[end : end + 1] == b'"' and data[end + 1 : end + 2] != b'"':
            pieces += 1
    return pieces


def _read_event(data: bytes, record: dict[str, Any]) -> int:
    """Decode one SSE ``data`` payload into ``record`` (usage, workers, errors); the choices with text."""
    try:
        item = json.loads(data)
    except ValueError:
        record["error"] = f"bad SSE data: {data[:80]!r}"
        return 0
    pieces = 0
    for choice in item.get("choices") or ():
        delta = choice.get("delta")
        text = delta.get("content") if delta else choice.get("text")
        if text:
            pieces += 1
    usage = item.get("usage")
    if usage:
        _usage(record, usage)
    if "nvext" in item:
        _worker_ids(record, item["nvext"])
    if "error" in item:
        record["error"] = _error_text(500, data)
    return pieces


async def _read_stream(answer: HttpAnswer, record: dict[str, Any]) -> list[float]:
    """Token event times; fills usage, workers and errors into ``record``. A payload that
    carries only tokens is counted from its bytes (`text_pieces`), the rest is decoded."""
    times: list[float] = []
    append = times.append
    pending = b""
    async for chunk in answer:
        now = perf_counter()
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]" or not data:
                    continue
                pieces = text_pieces(data)
                if pieces is None:
                    pieces = _read_event(data, record)
                for _ in range(pieces):
                    append(now)
    return times


async def _read_unary(answer: HttpAnswer, record: dict[str, Any]) -> list[float]:
    body = json.loads(await answer.read())
    if not isinstance(body, dict):
        raise ValueError(f"the answer is not a JSON object: {body!r:.80}")
    _usage(record, body.get("usage") or {})
    if "nvext" in body:
        _worker_ids(record, body["nvext"])
    return [perf_counter()]


class _Deadline:
    """Cancels the task that entered it once ``seconds`` have passed; `expired` says it did
    (``asyncio.timeout`` for Python 3.10 too, one timer and no task)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> _Deadline:
        self._task = asyncio.current_task()
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.expired and self._task is not None and hasattr(self._task, "uncancel"):
            self._task.uncancel()


async def send_request(
    client: LeanHttpClient,
    url: str,
    payload: bytes,
    record: dict[str, Any],
    *,
    stream: bool,
    timeout: float,
    origin: float,
) -> dict[str, Any]:
    """POST ``payload`` to ``url`` and fill ``record``'s timing columns (never raises for the server).

    ``origin`` is the run's start (``perf_counter``); a request that fails keeps its error
    text in ``record["error"]`` and NaN for the times it did not reach. ``timeout`` bounds
    the whole request, the body's reading included.
    """
    start = perf_counter()
    record["sent_s"] = start - origin
    times: list[float] = []
    deadline = _Deadline(timeout)
    answer = None
    try:
        with deadline:
            answer = await client.request("POST", url, payload, _JSON_HEADERS)
            record["status"] = answer.status
            record["request_id"] = answer.headers.get("x-request-id")
            route = answer.headers.get("x-dynamo-path")  # our frontend: fast, fallback or aggregated
            if route:
                record["path"] = route
            if answer.status != 200:
                record["error"] = _error_text(answer.status, await answer.read())
            else:
                times = await (_read_stream if stream else _read_unary)(answer, record)
    except asyncio.CancelledError:
        if not deadline.expired:
            raise
        record["error"] = f"no complete answer within {timeout:g} s"
    except (OSError, ValueError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if answer is not None:
            answer.close()
    end = perf_counter()
    record["e2e_s"] = end - start
    if times:
        record["ttft_s"] = times[0] - start
        record["itl_s"] = [b - a for a, b in itertools.pairwise(times)]
        if record["output_tokens"] is None:
            record["output_tokens"] = len(times)
    elif record["error"] is None:
        record["error"] = "the answer had no tokens"
    return record
