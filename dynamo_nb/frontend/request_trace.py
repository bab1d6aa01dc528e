"""The frontend's request trace: one JSON line per finished request, for replay and planning.

Turned on with ``--request-trace PATH`` (or ``DYN_NB_REQUEST_TRACE=PATH``). Each line is a
Dynamo ``dynamo.request.trace.v1`` ``request_end`` event: when the request arrived, its input and
output lengths, the tokens its engine found cached, TTFT, mean ITL and end-to-end time, the
workers that served it and its disaggregated path, and the prompt's block hashes
(``replay.input_sequence_hashes``, one per 64 tokens, the last block partial) — so its prefix structure survives
without its text. `dynamo_nb.bench.read_trace` reads these files back (and Mooncake's).

Example:
    >>> import tempfile, json, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "trace.jsonl"
    >>> writer = RequestTraceWriter(path)
    >>> writer.write(TracedRequest("r1", "tiny", list(range(130)), received_ms=1000.0, output_tokens=4))
    >>> writer.close()
    >>> line = json.loads(path.read_text())
    >>> line["schema"], line["request"]["replay"]["input_length"], len(line["request"]["replay"]["input_sequence_hashes"])
    ('dynamo.request.trace.v1', 130, 3)
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..router.kv.hashing import block_hashes, sequence_hashes

__all__ = ["REQUEST_TRACE_ENV", "TRACE_BLOCK_SIZE", "TRACE_SCHEMA", "RequestTraceWriter", "TracedRequest"]

TRACE_SCHEMA = "dynamo.request.trace.v1"
TRACE_BLOCK_SIZE = 64  # tokens per block of the prompt hashes a trace keeps
REQUEST_TRACE_ENV = "DYN_NB_REQUEST_TRACE"
_FLUSH_SECONDS = 1.0


@dataclass
class TracedRequest:
    """What the frontend knows of one finished request (times in milliseconds)."""

    request_id: str
    model: str
    token_ids: list[int]
    received_ms: float  # Unix time it arrived
    output_tokens: int = 0
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    itl_ms: float | None = None
    finish_reason: str | None = None
    workers: dict[str, Any] = field(default_factory=dict)
    path: str | None = None  # fast, fallback, aggregated (models with prefill workers)
    aggregated_because: str | None = None  # why a model with prefill workers served it aggregated
    status: str = "success"


class RequestTraceWriter:
    """Appends `TracedRequest` records to ``path`` as JSON lines, buffered: each line is in the
    file within a second of its request's end (a timer flushes what waits; without an event
    loop, at once) and everything on `close`, so a reader of a running frontend's file (the
    `dynamo_nb.planner.Retuner`) lags it by a second at most."""

    def __init__(self, path: str | os.PathLike[str], block_size: int = TRACE_BLOCK_SIZE) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.block_size = block_size
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._flushed = time.monotonic()
        self._flush_timer: asyncio.TimerHandle | None = None
        self.written = 0

    def write(self, request: TracedRequest) -> None:
        """Append one request's line (in the file within `_FLUSH_SECONDS`)."""
        if self._file is None:
            return
        self._file.write(json.dumps(self.event(request), separators=(",", ":")) + "\n")
        self.written += 1
        now = time.monotonic()
        if now - self._flushed >= _FLUSH_SECONDS:
            self.flush()
        elif self._flush_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop to come back on: now
                self.flush()
            else:
                self._flush_timer = loop.call_later(_FLUSH_SECONDS, self.flush)

    def event(self, request: TracedRequest) -> dict[str, Any]:
        """The ``dynamo.request.trace.v1`` ``request_end`` event of ``request``."""
        local = block_hashes(request.token_ids, self.block_size)
        tail = request.token_ids[len(local) * self.block_size :]
        if tail:  # the last, partial block counts too (as Mooncake's hash_ids do)
            local += block_hashes(tail, len(tail))
        hashes = sequence_hashes(local)
        body: dict[str, Any] = {
            "request_id": request.request_id,
            "model": request.model,
            "status": request.status,
            "request_received_ms": round(request.received_ms, 3),
            "input_tokens": len(request.token_ids),
            "output_tokens": request.output_tokens,
            "cached_tokens": request.cached_tokens,
            "ttft_ms": _ms(request.ttft_ms),
            "avg_itl_ms": _ms(request.itl_ms),
            "total_time_ms": _ms(request.total_ms),
            "finish_reason": request.finish_reason,
            "worker": request.workers,
            "path": request.path,
            **({"aggregated_because": request.aggregated_because} if request.aggregated_because else {}),
            "replay": {
                "trace_block_size": self.block_size,
                "input_length": len(request.token_ids),
                "input_sequence_hashes": [
                    h & 0xFFFFFFFFFFFF for h in hashes
                ],  # 48 bits: exact in JSON readers
            },
        }
        end_ms = request.received_ms + (request.total_ms or 0.0)
        return {
            "schema": TRACE_SCHEMA,
            "event_type": "request_end",
            "event_time_unix_ms": round(end_ms, 3),
            "request": body,
        }

    def flush(self) -> Path:
        """Write what is buffered now (to read the trace while the frontend runs); the path."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._file is not None:
            self._file.flush()
            self._flushed = time.monotonic()
        return self.path

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
