"""How far replay is from the live run it predicts: the hf engine (the built-in tiny model, behind
the frontend, in this process) profiled (`bench.profile`), then one synthetic trace per load sent
live (`bench.run_trace`) and replayed on one mocker worker with Dynamo's default curves and with
the profiled model (`replay.fidelity`), side by side, in one run. Both replays add the request
overhead the profile measured between the client and the engine (`Fleet.overhead_ms`).

Three loads: below, near and past what one worker answers on these 2 cores (the achieved
request rate says which). Per load and model: TTFT and ITL p50/p90 and output tokens/s, replay
against live, the error in percent, and the per-request TTFT error (MAPE). The issue's bar for the
profiled model: TTFT p50 and ITL p50 within 15 %, p90 within 25 % (reported, whatever it is).

    python benchmarks/fidelity.py [--requests 80]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb import DistributedRuntime, bench
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.hf import HFEngine
from dynamo_nb.engines.mocker_timing import ProfiledTiming
from dynamo_nb.frontend import Frontend
from dynamo_nb.models import tiny_model_path
from dynamo_nb.replay import Fleet, MockerSettings, fidelity

MODEL, RATES = "tiny-llama", (5.0, 20.0, 60.0)
BARS = {"ttft_p50_ms": 15.0, "itl_p50_ms": 15.0, "ttft_p90_ms": 25.0, "itl_p90_ms": 25.0}


async def main(requests: int) -> dict[str, Any]:
    async with await DistributedRuntime.create() as runtime:
        engine = await HFEngine.load(tiny_model_path())
        await serve_engine(runtime, WorkerRole(), tiny_model_path(), MODEL, lambda kv_events: engine)
        frontend = await Frontend.start(runtime, port=0)
        try:
            await frontend.wait_for_model(MODEL)
            measured = await bench.profile(frontend.url, MODEL, progress=False)
            with tempfile.TemporaryDirectory() as folder:
                profiled_settings = MockerSettings(block_size=engine.block_size or 16, max_num_seqs=engine.max_num_seqs or 64,
                                                   planner_profile_data=str(measured.write(Path(folder) / "hf")))  # fmt: skip
                models = {
                    "Dynamo's curves": MockerSettings(block_size=engine.block_size or 16),
                    "profiled": profiled_settings,
                }
                loads = []
                for rate in RATES:
                    trace = bench.synthetic_trace(
                        requests, rate=rate, prefix_blocks=2, output_length=32, seed=1
                    )
                    live = await bench.run_trace(frontend.url, MODEL, trace, progress=False)
                    fleet = Fleet(workers=1, router="round-robin", overhead_ms=measured.request_overhead_ms)
                    table = fidelity(trace, live, models, fleet=fleet)
                    achieved = bench.summary(live)["req_per_s"].iloc[0]
                    loads.append({"rate": rate, "achieved_req_per_s": float(achieved),
                                  "rows": table.to_dict(orient="records")})  # fmt: skip
        finally:
            await frontend.stop()
            await engine.close()
    fit = ProfiledTiming.fit(measured)
    errors = fit.residuals()
    return {
        "benchmark": "fidelity",
        "machine": machine(),
        "engine": "hf (the built-in tiny model, CPU), behind the frontend in this process; replayed on 1 mocker worker",
        "trace": {
            "requests": requests,
            "prefix_blocks": 2,
            "user_blocks": 1,
            "block_size": 64,
            "output_length": 32,
        },
        "profile": {
            "model": repr(fit),
            "prefill_points": len(measured.prefill),
            "decode_points": len(measured.decode),
            "request_overhead_ms": measured.request_overhead_ms,
            "worst_prefill_fit_pct": max(abs(e) for e in errors["prefill"]),
            "worst_decode_fit_pct": max(abs(e) for e in errors["decode"]),
        },
        "bars_pct": BARS,
        "loads": loads,
        "profiled_within_bars": {
            str(load["rate"]): all(
                abs(row["error_pct"]) <= BARS[row["figure"]]
                for row in load["rows"]
                if row["model"] == "profiled" and row["figure"] in BARS
            )
            for load in loads
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"profile: {result['profile']['model']}; {result['profile']['request_overhead_ms']:.2f} ms a request "
          "between the client and the engine (the replayed fleet's overhead_ms)")  # fmt: skip
    print(f"  fit within {result['profile']['worst_prefill_fit_pct']:.1f} % (prefill), "
          f"{result['profile']['worst_decode_fit_pct']:.1f} % (decode) of each measured point")  # fmt: skip
    for load in result["loads"]:
        print(
            f"\n{load['rate']:g} req/s offered, {load['achieved_req_per_s']:.1f} answered; replay vs live, error %"
        )
        print(f"  {'figure':18} {'live':>9} {'curves':>9} {'err %':>8} {'profiled':>9} {'err %':>8}")
        by = {(row["model"], row["figure"]): row for row in load["rows"]}
        for figure in (
            "ttft_p50_ms",
            "ttft_p90_ms",
            "itl_p50_ms",
            "itl_p90_ms",
            "output_tok_per_s",
            "ttft_mape_pct",
        ):
            curves, profiled = by[("Dynamo's curves", figure)], by[("profiled", figure)]
            print(f"  {figure:18} {curves['live']:9.1f} {curves['replay']:9.1f} {curves['error_pct']:8.1f} "
                  f"{profiled['replay']:9.1f} {profiled['error_pct']:8.1f}")  # fmt: skip
    print(
        f"\nthe profiled model within the bars (TTFT/ITL p50 ±15 %, p90 ±25 %): {result['profiled_within_bars']}"
    )


if __name__ == "__main__":
    run_benchmark(__doc__, "fidelity", main, print_table, requests=80, requests_help="requests per load")
