"""Request traces: the frontend captures one line per finished request (``--request-trace``) that
reads back with what each answer said, in its own format and in Mooncake's; Mooncake's public
format parses; synthetic traces have the prefix structure and arrivals asked for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port

from dynamo_nb import bench
from dynamo_nb.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

MOONCAKE_SAMPLE = [  # the first lines of Mooncake's public trace, in its format
    {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 6472, "output_length": 26, "hash_ids": [*range(12), 14]},
    {"timestamp": 3052, "input_length": 6955, "output_length": 52, "hash_ids": [*range(12), 15, 16]},
]


def test_a_mooncake_trace_parses_with_its_prefix_structure(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in MOONCAKE_SAMPLE))
    trace = bench.read_trace(path)
    assert trace.attrs["block_size"] == 512
    assert trace["input_length"].tolist() == [6955, 6472, 6955] and trace["timestamp_ms"].tolist() == [
        0,
        0,
        3052,
    ]
    assert [ids[:12] for ids in trace["hash_ids"]] == [list(range(12))] * 3  # a shared prefix of 12 blocks
    again = bench.read_trace(bench.save_trace(trace, tmp_path / "again.jsonl"))
    assert again[["timestamp_ms", "input_length", "output_length"]].equals(
        trace[["timestamp_ms", "input_length", "output_length"]]
    )
    assert again["hash_ids"].tolist() == trace["hash_ids"].tolist()


def test_a_line_that_is_no_trace_says_what_was_expected(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="expected Mooncake's timestamp"):
        bench.read_trace(path)


def test_a_synthetic_trace_has_the_prefix_groups_and_rate_asked_for() -> None:
    trace = bench.synthetic_trace(400, rate=10.0, prefix_groups=4, prefix_blocks=5, user_blocks=2, seed=3)
    assert trace["group"].nunique() == 4
    for group, rows in trace.groupby("group"):
        assert {tuple(ids[:5]) for ids in rows["hash_ids"]} == {tuple(range(group * 5, group * 5 + 5))}
    assert trace["hash_ids"].map(lambda ids: tuple(ids[5:])).is_unique  # each request's own blocks
    seconds = trace["timestamp_ms"].iloc[-1] / 1000
    assert 30 < seconds < 50  # 399 gaps of 0.1 s on average, Poisson
    assert bench.synthetic_trace(5, rate=2.0, seed=1).equals(bench.synthetic_trace(5, rate=2.0, seed=1))
    same_group = trace[trace["group"] == trace["group"].iloc[0]].head(2)
    first, second = (
        bench.trace_token_ids(ids, n, 64)
        for ids, n in zip(same_group["hash_ids"], same_group["input_length"], strict=True)
    )
    assert len(first) == same_group["input_length"].iloc[0] == 7 * 64
    assert first[: 5 * 64] == second[: 5 * 64] and first[5 * 64 :] != second[5 * 64 :]  # prompts to replay


async def test_the_frontend_captures_each_finished_request(
    services: Any, start_worker: Any, tmp_path: Path
) -> None:
    etcd = ["--discovery", services.etcd_url]
    await start_worker(
        *etcd, "--endpoint", "trace.backend.generate", "--speedup-ratio", "20", script=MOCKER_WORKER
    )
    port = free_port()
    path = tmp_path / "trace.jsonl"
    frontend = await start_worker(
        *etcd, "--http-port", str(port), "--request-trace", str(path), script=FRONTEND
    )
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)
    answers = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for i in range(5):
            body = {"model": "tiny-llama", "prompt": list(range(20, 100 + 30 * i)), "max_tokens": 3 + i}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            answers.append((response.headers["x-request-id"], response.json()["usage"]))
    # a running frontend's file has each request within a second (a Retuner reads it), the last too
    for _ in range(200):
        if path.exists() and answers[-1][0] in path.read_text():
            break
        await asyncio.sleep(0.05)
    assert answers[-1][0] in path.read_text(), "the last request's line was not flushed while running"
    await frontend.stop(timeout=10)  # the trace is flushed as the frontend stops

    trace = bench.read_trace(path)
    assert trace.attrs["block_size"] == 64 and len(trace) == 5
    assert trace["request_id"].tolist() == [request_id for request_id, _ in answers]
    assert trace["input_length"].tolist() == [usage["prompt_tokens"] for _, usage in answers]
    assert trace["output_length"].tolist() == [usage["completion_tokens"] for _, usage in answers]
    assert trace["cached_tokens"].tolist() == [
        usage["prompt_tokens_details"]["cached_tokens"] for _, usage in answers
    ]
    assert (trace["ttft_ms"] > 0).all() and (trace["total_time_ms"] >= trace["ttft_ms"]).all()
    assert trace["worker"].str.fullmatch("[0-9a-f]+").all()  # hex instance ids, as bench.run has them
    assert trace["timestamp_ms"].is_monotonic_increasing and trace["timestamp_ms"].iloc[0] == 0
    first_blocks = {ids[0] for ids in trace["hash_ids"]}
    assert len(first_blocks) == 1  # every prompt starts with the same 64 tokens: one shared first block
    assert trace["hash_ids"].map(len).tolist() == [-(-n // 64) for n in trace["input_length"]]
    mooncake = bench.read_trace(bench.save_trace(trace, tmp_path / "mooncake.jsonl"))
    assert mooncake["hash_ids"].tolist() == trace["hash_ids"].tolist()
