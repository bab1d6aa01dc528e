"""Offline replay in virtual time: the mocker's scheduler and the real routers on a simulated
clock give `bench.run`'s columns, the same answer for the same seed, prefix reuse where the KV
router finds it, and disaggregated requests that go prefill then decode; a trace replayed live
through a frontend and mocker workers sends what the trace says."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port

from dynamo_nb import bench
from dynamo_nb.engines.mocker_scheduler import MockerScheduler, MockJob
from dynamo_nb.errors import ConfigError
from dynamo_nb.replay import Fleet, MockerSettings, TraceBlocks, replay
from dynamo_nb.router.policy import RouterPolicy

pytestmark = pytest.mark.timeout(120)


def shared_prefix_trace(requests: int = 400, rate: float = 40.0, seed: int = 1) -> Any:
    return bench.synthetic_trace(
        requests, rate=rate, prefix_groups=8, prefix_blocks=16, user_blocks=2, output_length=24, seed=seed
    )


def test_a_replay_gives_every_request_the_columns_of_a_live_run() -> None:
    trace = shared_prefix_trace()
    result = replay(trace, Fleet(workers=3, router="kv"))
    df = result.requests
    assert list(df.columns) == bench.RECORD_COLUMNS and len(df) == len(trace)
    assert df["error"].isna().all() and (df["status"] == 200).all()
    assert df["output_tokens"].tolist() == trace["output_length"].tolist()
    assert df["input_tokens"].tolist() == trace["input_length"].tolist()
    assert df["sent_s"].tolist() == pytest.approx((trace["timestamp_ms"] / 1000).tolist())
    assert (df["ttft_s"] > 0).all() and (df["e2e_s"] >= df["ttft_s"]).all()
    assert df["itl_s"].map(len).tolist() == (trace["output_length"] - 1).tolist()
    assert df["worker"].nunique() == 3 and set(df["path"]) == {"aggregated"}
    summary = bench.summary(df)  # what reads a live run reads a replay
    assert summary["requests"].iloc[0] == len(trace)
    assert result.virtual_s == pytest.approx(float((df["sent_s"] + df["e2e_s"]).max()))
    assert result.speed > 1 and result.steps > 0


def test_a_replay_is_the_same_for_the_same_seed_and_draws_differently_for_another() -> None:
    trace = shared_prefix_trace(200)
    for fleet in (Fleet(workers=4, router="random"), Fleet(workers=4, router="kv", router_policy=RouterPolicy(temperature=0.5)),
                  Fleet(workers=4, router="least-loaded"), Fleet(prefill=2, decode=2, router="kv")):  # fmt: skip
        first, again = replay(trace, fleet, seed=7).requests, replay(trace, fleet, seed=7).requests
        columns = ["worker", "prefill_worker", "ttft_s", "e2e_s", "cached_tokens"]
        assert first[columns].equals(again[columns]), fleet
        assert first["itl_s"].tolist() == again["itl_s"].tolist()
    random_fleet = Fleet(workers=4, router="random")
    assert (
        not replay(trace, random_fleet, seed=1)
        .requests["worker"]
        .equals(replay(trace, random_fleet, seed=2).requests["worker"])
    )


def test_one_request_takes_exactly_the_mocker_schedulers_steps() -> None:
    frame = bench.synthetic_trace(
        1, rate=1.0, prefix_groups=1, prefix_blocks=2, user_blocks=1, output_length=5
    )
    result = replay(frame, Fleet(workers=1))
    scheduler = MockerScheduler()
    scheduler.add(MockJob(prompt_len=3 * 64, max_tokens=5, hashes=(list(range(12)), list(range(100, 112)))))
    step_ends, clock = [], 0.0
    while scheduler.busy:
        chunks, seconds = scheduler.plan_step()
        clock += seconds
        scheduler.finish_step(chunks)
        step_ends.append(clock)
    row = result.requests.iloc[0]
    assert row["ttft_s"] == pytest.approx(step_ends[0])
    assert row["e2e_s"] == pytest.approx(step_ends[-1])
    assert row["itl_s"] == pytest.approx([b - a for a, b in itertools.pairwise(step_ends)])


def test_the_kv_router_finds_the_prefixes_round_robin_spreads() -> None:
    trace = shared_prefix_trace()
    small_pool = MockerSettings(num_blocks=320)  # holds a few of the 8 system prompts, not all
    kv = replay(trace, Fleet(workers=4, router="kv"), small_pool).requests
    round_robin = replay(trace, Fleet(workers=4, router="round-robin"), small_pool).requests
    assert kv["cached_tokens"].sum() > 2 * round_robin["cached_tokens"].sum()
    groups = trace["group"].to_numpy()
    kv_spread = kv.assign(group=groups).groupby("group")["worker"].nunique()
    round_robin_spread = round_robin.assign(group=groups).groupby("group")["worker"].nunique()
    assert kv_spread.mean() < round_robin_spread.mean() == 4  # a system prompt stays on fewer workers


def test_a_disaggregated_replay_prefills_on_one_pool_and_decodes_on_the_other() -> None:
    trace = shared_prefix_trace(200)
    result = replay(trace, Fleet(prefill=2, decode=3, router="kv", transfer_ms=2.0))
    df = result.requests
    assert df["error"].isna().all() and set(df["path"]) == {"fast"}
    assert set(df["prefill_worker"]).isdisjoint(set(df["worker"]))
    assert df["prefill_worker"].nunique() == 2 and df["worker"].nunique() == 3
    assert df["output_tokens"].tolist() == trace["output_length"].tolist()
    second_gaps = df["itl_s"].map(lambda gaps: gaps[0])
    assert (second_gaps >= 0.002).all()  # the transfer sits between the prefill's token and the decode's
    assert result.busy_s["prefill"] > 0 and result.busy_s["decode"] > 0


def test_a_prompt_no_pool_can_hold_is_an_error_row_not_a_hang() -> None:
    trace = bench.synthetic_trace(3, rate=1.0, prefix_groups=1, prefix_blocks=4, user_blocks=1)
    df = replay(trace, Fleet(workers=1), MockerSettings(num_blocks=8)).requests
    assert df["error"].str.contains("--num-gpu-blocks").all() and (df["status"] == 400).all()


def test_trace_blocks_share_exactly_the_engine_blocks_of_a_shared_trace_prefix() -> None:
    blocks = TraceBlocks(trace_block_size=512, block_size=16)
    a, a_sequence = blocks.hashes([1, 2, 3], 1500)
    b, b_sequence = blocks.hashes([1, 2, 4], 1500)
    assert len(a) == 1500 // 16 and a[:64] == b[:64] and a[64] != b[64]
    assert a_sequence[:64] == b_sequence[:64] and a_sequence[64] != b_sequence[64]
    uneven = TraceBlocks(trace_block_size=64, block_size=48)
    c, _ = uneven.hashes([5, 6, 7], 192)
    d, _ = uneven.hashes([5, 9, 7], 192)
    assert c[0] == d[0] and c[1] != d[1]  # the second 48 tokens reach into the second trace block
    with pytest.raises(ConfigError, match="block sizes"):
        TraceBlocks(0, 16)


def test_a_mooncake_trace_replays_at_the_engines_block_size(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 2000, "output_length": 8, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 500, "input_length": 2000, "output_length": 8, "hash_ids": [0, 1, 2, 4]},
    ]
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    df = replay(bench.read_trace(path), Fleet(workers=1)).requests
    assert df["cached_tokens"].tolist() == [0, 3 * 512]  # the second finds the first's 3 shared blocks


def test_a_fleet_says_what_is_wrong_with_it() -> None:
    with pytest.raises(ConfigError, match="unknown router"):
        Fleet(router="fastest")
    with pytest.raises(ConfigError, match="at least 1 prefill and 1 decode"):
        Fleet(prefill=2)
    with pytest.raises(ConfigError, match="hash_ids"):
        replay(bench.synthetic_trace(2, rate=1.0).drop(columns=["hash_ids"]))


def test_mocker_settings_are_the_mocker_workers_flags() -> None:
    from dynamo_nb.flags import mocker_worker_parser

    parser = mocker_worker_parser()
    assert MockerSettings.from_args(parser.parse_args([])) == MockerSettings()
    custom = MockerSettings(block_size=32, num_blocks=100, speedup_ratio=4)
    assert MockerSettings.from_args(parser.parse_args(custom.argv())) == custom


@pytest.mark.processes
async def test_a_trace_replayed_live_sends_its_arrivals_lengths_and_prefixes(
    services: Any, start_worker: Any
) -> None:
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    settings = MockerSettings(speedup_ratio=10)
    await start_worker(*bus, "--endpoint", "livetrace.backend.generate", "--num-workers", "2",
                       *settings.argv(), "--context-length", "8192", script=MOCKER_WORKER)  # fmt: skip
    port = free_port()
    await start_worker(*bus, "--http-port", str(port), "--router-mode", "kv", script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", instances=2, timeout=30)
    trace = shared_prefix_trace(40, rate=20.0)
    live = await bench.run_trace(url, "tiny-llama", trace, speedup=10, progress=False)
    assert live["error"].isna().all(), live["error"].dropna().tolist()
    assert live["input_tokens"].tolist() == trace["input_length"].tolist()
    assert live["output_tokens"].tolist() == trace["output_length"].tolist()
    # each request leaves at its arrival (in trace time), never before it, in the trace's order; how
    # late on a busy machine is not the replayer's to promise (a busy machine once held one run's
    # sends for 0.6 s, 6 s in trace time), but a speedup not applied would send the last one at 10
    # times its time: the bound is halfway between
    scheduled, sent = (trace["timestamp_ms"] / 1000).tolist(), live["sent_s"].tolist()
    assert all(s >= t - 0.05 for s, t in zip(sent, scheduled, strict=True)), (sent, scheduled)
    assert sent == sorted(sent) and sent[-1] < 5.5 * scheduled[-1], (sent, scheduled)
    assert live["cached_tokens"].sum() > 0 and live["worker"].nunique() == 2  # the prefixes were found
    offline = replay(trace, Fleet(workers=2, router="kv"))
    assert live["cached_tokens"].sum() >= 0.8 * offline.requests["cached_tokens"].sum()


def test_a_closed_loop_keeps_that_many_requests_in_flight() -> None:
    trace = bench.synthetic_trace(60, rate=1000.0, seed=4)
    result = replay(trace, Fleet(workers=2), concurrency=3)
    requests = result.requests
    starts = requests["sent_s"].astype(float).tolist()
    ends = (requests["sent_s"] + requests["e2e_s"]).astype(float).tolist()
    assert sorted(starts)[:3] == [0.0, 0.0, 0.0] and sorted(starts)[3] > 0
    for start in starts:  # never more than 3 in flight: each later one is sent as one finishes
        in_flight = sum(1 for s, e in zip(starts, ends, strict=True) if s <= start < e)
        assert in_flight <= 3
    assert all(start == 0.0 or any(abs(start - end) < 1e-12 for end in ends) for start in starts)
    assert set(requests["concurrency"]) == {3} and requests["error"].isna().all()
    with pytest.raises(ConfigError, match="at least 1"):
        replay(trace, Fleet(workers=2), concurrency=0)
