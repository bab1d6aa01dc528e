"""One huge prompt against a real frontend process: refused from its size, before it is decoded,
rendered or tokenized, while the frontend keeps answering `/live`, with its memory bounded and
given back. (10 MB of short words used to hold the event loop for ~10 s and keep ~1 GB; after the
bound on text length, a 30 MB body still raised the peak RSS by ~125 MB while it was decoded.)"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port
from test_message_memory import MB, peak_rise, reset_peak

from dynamo_nb.http import fetch

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not Path("/proc/self/clear_refs").exists(),
        reason="needs Linux's /proc/PID/clear_refs to reset a process's peak RSS",
    ),
]


def rss(pid: int) -> int:
    """The process's resident memory now, in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) * 1024


async def live_answer_s(port: int) -> float:
    """Seconds ``/live`` took to answer 200."""
    started = time.perf_counter()
    status, _ = await fetch(f"http://127.0.0.1:{port}/live", timeout=30)
    assert status == 200
    return time.perf_counter() - started


async def send_slowly_while_live_answers(port: int, body: bytes) -> tuple[int, bytes, list[float]]:
    """POST ``body`` a MB at a time, asking ``/live`` between the pieces: (status, answer, the
    seconds ``/live`` took each time while the body was in flight)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode())
    answers = []
    try:
        for start in range(0, len(body), MB):
            writer.write(body[start : start + MB])
            await writer.drain()
            answers.append(await live_answer_s(port))
        raw = await asyncio.wait_for(reader.read(-1), 60)
    finally:
        writer.close()
    head_bytes, _, answer = raw.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), answer, answers


async def test_a_huge_prompt_is_refused_from_its_size_with_memory_bounded(
    services: Any, start_worker: Any
) -> None:
    discovery = ["--discovery", services.etcd_url]
    await start_worker(*discovery, "--speedup-ratio", "100", script=MOCKER_WORKER)
    port = free_port()
    # glibc raises its mmap threshold to the largest block freed (up to 32 MB) and then keeps up to
    # twice that at the heap's top untrimmed: a fixed threshold makes "given back" measure what the
    # frontend keeps, not what the allocator chose to hold on to
    frontend = await start_worker(
        *discovery, "--http-port", str(port), script=FRONTEND, env={"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    )
    for _ in range(300):  # the model card arrives through etcd
        if b"tiny-llama" in (await fetch(f"http://127.0.0.1:{port}/v1/models", timeout=10))[1]:
            break
        await asyncio.sleep(0.1)
    for size in (10 * MB, 30 * MB):
        text = "a b " * (size // 4)
        body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": text}]}).encode()
        del text
        before = rss(frontend.pid)
        idle = max([await live_answer_s(port) for _ in range(10)])  # this machine's pace now
        reset_peak(frontend.pid)
        status, answer, answers = await send_slowly_while_live_answers(port, body)
        assert status == 400, answer[:300]
        error = json.loads(answer)["error"]
        assert error["param"] == "messages" and "more than a prompt that fits" in error["message"], error
        assert len(answers) == -(-len(body) // MB)  # /live answered after every MB of the body
        # ... within 100 ms each (a probe's budget), or 4x this machine's idle pace when it is busier
        assert max(answers) <= max(0.1, 4 * idle), (max(answers), idle)
        rise = peak_rise(frontend.pid)
        assert rise < 100 * MB, f"a {size // MB} MB prompt raised the frontend's peak RSS by {rise // MB} MB"

        async def given_back(before: int = before) -> bool:
            return rss(frontend.pid) < before + 16 * MB

        for _ in range(100):  # the body's memory is freed once the answer is out
            if await given_back():
                break
            await asyncio.sleep(0.1)
        assert await given_back(), (before // MB, rss(frontend.pid) // MB)
    # and the frontend still serves
    good = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True}
    status, answer = await fetch(
        f"http://127.0.0.1:{port}/v1/completions", method="POST", body=json.dumps(good).encode(), timeout=60
    )
    assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 3, answer[:300]
