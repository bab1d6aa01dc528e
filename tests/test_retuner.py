"""`planner.Retuner` against a real frontend's admin API: a policy is applied only after it wins
by enough in enough windows in a row (scripted margins: noise and alternating winners do not
flap the router), a dry run changes nothing, a thin window waits, and a real retune of a
recorded trace runs end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dynamo_nb import ConfigError, DistributedRuntime, bench
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.frontend.admin import AdminAuth
from dynamo_nb.llm import serve_llm
from dynamo_nb.planner import Retune, Retuner
from dynamo_nb.replay import Fleet
from dynamo_nb.router.kv import KvRouterConfig
from dynamo_nb.router.policy import RouterPolicy

TOKEN = "a-retuner-token-of-some-length"
A, B = RouterPolicy(prefill_load_scale=8), RouterPolicy(prefill_load_scale=32)


@pytest.fixture
async def frontend(tiny_path: Any) -> Any:
    runtimes = [await DistributedRuntime.create() for _ in range(2)]
    await serve_llm(runtimes[0].endpoint("rtn.backend.generate"), EchoEngine().generate, tiny_path,
                    model_name="rtn", kv_cache_block_size=4)  # fmt: skip
    front = await Frontend.start(runtimes[1], port=0, router_mode="kv", kv=KvRouterConfig(use_kv_events=False),
                                 admin=AdminAuth(TOKEN))  # fmt: skip
    await bench.wait_for_model(front.url, "rtn", timeout=10)
    yield front
    await front.stop()
    for runtime in runtimes:
        await runtime.shutdown()


def write_trace(path: Path, requests: int = 60) -> Path:
    trace = bench.synthetic_trace(requests, rate=20.0, prefix_groups=4, prefix_blocks=6, seed=3)
    with path.open("w") as out:
        for row in trace.itertuples():
            out.write(json.dumps({"timestamp": int(row.timestamp_ms), "input_length": int(row.input_length),
                                  "output_length": int(row.output_length), "hash_ids": list(row.hash_ids)}) + "\n")  # fmt: skip
    return path


def scripted(answers: list[tuple[RouterPolicy, float]]) -> Any:
    """A tune() that answers each window with the next (winner, margin %) instead of replaying."""
    left = list(answers)

    def tune(window: pd.DataFrame, grid: Any, *, incumbent: RouterPolicy, **_: Any) -> Retune:
        winner, margin = left.pop(0)
        if winner == incumbent or margin <= 0:
            winner, margin = incumbent, 0.0
        return Retune(pd.DataFrame(), winner, incumbent, "ttft_mean_ms", margin)

    return tune


async def test_a_winner_is_applied_only_after_confirm_windows_in_a_row(
    frontend: Frontend, tmp_path: Path
) -> None:
    trace = write_trace(tmp_path / "trace.jsonl")
    answers = [(A, 7.0), (A, 3.0), (A, 7.0), (B, 9.0), (A, 6.0), (B, 8.0), (B, 6.5), (B, 12.0)]
    retuner = Retuner(frontend.url, trace, {}, token=TOKEN, window_s=3600, min_improvement_pct=5, confirm=2,
                      tune=scripted(answers))  # fmt: skip
    for _ in answers:
        await retuner.step()
    actions = retuner.decisions["action"].tolist()
    # noise under the threshold resets; alternating winners never confirm; B twice in a row is applied,
    # then B is the incumbent: a window it "wins" again keeps it
    assert actions == ["hold", "keep", "hold", "hold", "hold", "hold", "applied", "keep"], retuner.decisions
    assert retuner.applied == [B] and frontend.models.kv_router_policy() == B
    assert retuner.decisions["incumbent"].iloc[-1].startswith("credit 1, scale 32")


async def test_a_margin_within_the_replays_measured_error_is_kept_not_applied(
    frontend: Frontend, tmp_path: Path
) -> None:
    """The tune is told the error; a win it calls within that error resets the streak."""
    trace = write_trace(tmp_path / "trace.jsonl")
    told: list[Any] = []

    def tune(window: pd.DataFrame, grid: Any, *, incumbent: RouterPolicy, error: Any, **_: Any) -> Retune:
        told.append(error)
        return Retune(pd.DataFrame(), A, incumbent, "ttft_mean_ms", 20.0, error, len(told) > 1)

    retuner = Retuner(frontend.url, trace, {}, token=TOKEN, window_s=3600, confirm=1, tune=tune,
                      error={"ttft_p50_ms": -25.0})  # fmt: skip
    first, second = await retuner.step(), await retuner.step()
    assert first["action"] == "keep" and "within the replay's measured error (±25 %)" in first["reason"]
    assert second["action"] == "applied" and told == [{"ttft_p50_ms": -25.0}] * 2


async def test_a_dry_run_changes_nothing_and_a_thin_window_waits(frontend: Frontend, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", requests=10)
    dry = Retuner(frontend.url, trace, {}, dry_run=True, token=TOKEN, min_requests=5, confirm=1, window_s=3600,
                  tune=scripted([(A, 50.0)]))  # fmt: skip
    row = await dry.step()
    assert (
        row["action"] == "would apply"
        and frontend.models.kv_router_policy() == RouterPolicy()
        and dry.applied == []
    )
    thin = Retuner(frontend.url, tmp_path / "none.jsonl", {}, token=TOKEN, tune=scripted([]))
    assert (await thin.step())["action"] == "wait"
    with pytest.raises(ConfigError, match="403"):
        await Retuner(frontend.url, trace, {}, token="a-wrong-token-of-length", min_requests=1).step()
    with pytest.raises(ConfigError, match="admin token"):
        Retuner(frontend.url, trace, {})


async def test_a_real_retune_of_a_recorded_trace(frontend: Frontend, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", requests=80)
    retuner = Retuner(frontend.url, trace, {"prefill_load_scale": [1, 16], "overlap_score_credit": [0, 1]},
                      fleet=Fleet(workers=2), token=TOKEN, window_s=3600, min_improvement_pct=0, confirm=1)  # fmt: skip
    row = await retuner.step()
    assert row["requests"] == 80 and row["action"] in ("applied", "keep")
    assert (row["action"] == "applied") == (retuner.applied != [])
    if retuner.applied:
        assert frontend.models.kv_router_policy() == retuner.applied[0] and row["margin_pct"] > 0
    assert retuner.chart() is not None
