"""`run_trace`: replay a request trace live, each request sent at its time, through any
OpenAI-compatible server.

Each request is a completion whose prompt is the trace's blocks as token ids
(`dynamo_nb.bench.traces.trace_token_ids`: equal block ids, equal tokens, so the server's
prefix caches and KV router see the trace's prefix structure) with ``max_tokens`` its
output length and ``ignore_eos``. ``speedup`` compresses the trace: requests are sent
``speedup`` times faster, for engines made as many times faster (the mocker's
``--speedup-ratio``), and the times it records are multiplied back, so the frame is on the
trace's own clock and compares with an offline `dynamo_nb.replay.replay` of the same trace.

Example::

    trace = bench.read_trace("trace.jsonl")
    df = await bench.run_trace("http://127.0.0.1:8000", "tiny-llama", trace, speedup=4)
    bench.summary(df)
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..http.lean_client import LeanHttpClient
from .http_client import RECORD_COLUMNS, send_request
from .progress import progress_bar
from .records import records_frame
from .runner import ENDPOINTS, _base_url
from .traces import in_arrival_order, trace_token_ids

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["run_trace"]


async def run_trace(
    url: str,
    model: str,
    trace: pd.DataFrame,
    *,
    speedup: float = 1.0,
    label: str = "",
    timeout: float = 300.0,
    vocab: int = 2000,
    progress: bool = True,
) -> pd.DataFrame:
    """Send ``trace``'s requests to ``url`` at their arrival times (divided by ``speedup``);
    one row per request with the columns of `bench.run`, times on the trace's clock.

    Args:
        url: the server's base URL.
        model: the model name to ask for.
        trace: a `bench.read_trace` / `synthetic_trace` frame.
        speedup: how many times faster than the trace to send (and to scale the times back).
        label: the ``label`` column.
        timeout: seconds one request may take (on the wall clock).
        vocab: token ids are drawn below this (the model's vocabulary must hold them).
        progress: a progress bar.
    """
    if not speedup > 0:
        raise ConfigError(f"speedup must be positive, got {speedup!r}")
    base = _base_url(url)
    block_size = int(trace.attrs.get("block_size", 64))
    order, origin_ms, offered = in_arrival_order(trace)
    sends = []
    for at_ms, inputs, outputs, ids in zip(
        order["timestamp_ms"], order["input_length"], order["output_length"], order["hash_ids"], strict=True
    ):
        body = {
            "model": model,
            "prompt": trace_token_ids(list(ids), int(inputs), block_size, vocab),
            "max_tokens": max(int(outputs), 1),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "nvext": {"extra_fields": ["worker_id"]},
        }
        sends.append(((float(at_ms) - origin_ms) / 1000.0 / speedup, json.dumps(body).encode()))
    records: list[dict[str, Any]] = []
    bar = progress_bar(total=len(sends), desc=f"{label + ' · ' if label else ''}trace", enabled=progress)
    async with LeanHttpClient() as client:
        loop = asyncio.get_running_loop()
        origin = perf_counter()
        start = loop.time()

        async def send(index: int, payload: bytes) -> None:
            record: dict[str, Any] = dict.fromkeys(RECORD_COLUMNS)
            record.update(label=label, rate=offered, index=index)
            await send_request(client, base + ENDPOINTS["completions"], payload, record,
                               stream=True, timeout=timeout, origin=origin)  # fmt: skip
            records.append(record)
            bar.update(1)

        tasks = []
        try:
            for index, (due, payload) in enumerate(sends):
                wait = start + due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.ensure_future(send(index, payload)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            bar.close()
    for record in records:  # back on the trace's clock
        for column in ("sent_s", "ttft_s", "e2e_s"):
            if record[column] is not None:
                record[column] *= speedup
        if isinstance(record["itl_s"], list):
            record["itl_s"] = [gap * speedup for gap in record["itl_s"]]
    records.sort(key=lambda r: r["index"])
    return records_frame(records)
