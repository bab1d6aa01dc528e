"""How far replay is from the live run it predicts: an engine (hf or vLLM on the CPU, the built-in
tiny model) served as it is deployed — its worker, the frontend and this client in three processes,
over etcd and the TCP request plane — profiled (`bench.profile`), then one synthetic trace per load
sent live (`bench.run_trace`) and replayed on one mocker worker with Dynamo's default curves and
with the profiled model (`replay.fidelity`), side by side, in one run. Both replays add the
request overhead the profile measured between the client and the engine (`Fleet.overhead_ms`).

The hf worker runs one OpenMP thread (``OMP_NUM_THREADS=1``, as the kit's vLLM worker does on a
small host): the engine has one core, the frontend and the client share the other. With two,
the engine's steps wait for a core the frontend holds whenever traffic is heavy — which no
profile sees and which makes two live runs of the same requests disagree.

Three loads: below, near and past what one worker answers on these 2 cores: 0.15, 0.5 and 0.95
times the rate at which it answers a burst of the trace's requests sent at once, measured first
(a full batch from the start: a steady load saturates below it, and the achieved request rate
of each load says where the knee is). Each load is sent live twice, every run's blocks new to the engine
(`bench.unseen_blocks`: nothing cached from an earlier run, as each replay starts cold); the
second run ("again") is the noise floor, how far two live runs of the same requests are apart.
Per load and model: TTFT and ITL p50/p90 and output tokens/s, replay
against live, the error in percent, and the per-request TTFT error (MAPE). The issue's bar for the
profiled model: TTFT p50 and ITL p50 within 15 %, p90 within 25 % (reported, whatever it is).

    python benchmarks/fidelity.py [--requests 400] [--engine hf|vllm]   # vllm: results/fidelity_vllm.json
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb import LocalServices, bench, launch, launched
from dynamo_nb.engines.mocker_timing import ProfiledTiming
from dynamo_nb.replay import Fleet, MockerSettings, fidelity

MODEL, LOADS = "tiny-llama", (0.15, 0.5, 0.95)  # of the burst's request rate
BARS = {"ttft_p50_ms": 15.0, "itl_p50_ms": 15.0, "ttft_p90_ms": 25.0, "itl_p90_ms": 25.0}


# each engine's worker, the environment it runs in and the scheduler limits it is started with
# (which the replayed mocker is given too)
WORKERS: dict[str, tuple[str, dict[str, str], dict[str, int], tuple[str, ...]]] = {
    "hf": ("components/hf_worker.py", {"OMP_NUM_THREADS": "1"},
           {"block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 2048}, ()),
    "vllm": ("components/vllm_worker.py", {},
             {"block_size": 32, "max_num_seqs": 256, "max_num_batched_tokens": 4096}, ("--enforce-eager",)),
}  # fmt: skip


async def main(requests: int, engine_name: str) -> dict[str, Any]:
    program, env, limits, extra = WORKERS[engine_name]
    services = await LocalServices.start()
    try:
        bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--log-level", "ERROR"]
        flags = [
            "--max-num-seqs",
            limits["max_num_seqs"],
            "--max-num-batched-tokens",
            limits["max_num_batched_tokens"],
        ]
        await launch(program, *bus, *flags, *extra, env=env, show_logs=False, timeout=300)
        frontend = await launch("components/frontend.py", *bus, "--http-port", 0, show_logs=False)
        await bench.wait_for_model(frontend.url, MODEL)
        # the decode grid up to the batch the engine may run (beyond it a replay extrapolates)
        batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= limits["max_num_seqs"])
        measured = await bench.profile(frontend.url, MODEL, batches=batches, progress=False)
        with tempfile.TemporaryDirectory() as folder:
            models = {
                "Dynamo's curves": MockerSettings(**limits),
                "profiled": MockerSettings(
                    **limits, planner_profile_data=str(measured.write(Path(folder) / "p"))
                ),
            }
            burst = bench.synthetic_trace(requests, rate=10_000.0, prefix_blocks=2, output_length=32, seed=1)
            sustained = bench.summary(await bench.run_trace(frontend.url, MODEL, burst, progress=False))
            capacity = float(sustained["req_per_s"].iloc[0])
            loads = []
            for number, share in enumerate(LOADS, start=1):
                rate = round(share * capacity, 1)
                trace = bench.synthetic_trace(requests, rate=rate, prefix_blocks=2, output_length=32, seed=1)
                # each run's blocks new to the engine: a cold cache, as each replay starts
                live, again = [
                    await bench.run_trace(
                        frontend.url, MODEL, bench.unseen_blocks(trace, 2 * number + run), progress=False
                    )
                    for run in (1, 2)
                ]
                fleet = Fleet(workers=1, router="round-robin", overhead_ms=measured.request_overhead_ms)
                table = fidelity(trace, live, models, fleet=fleet, again=again)
                achieved = bench.summary(live)["req_per_s"].iloc[0]
                loads.append({"share_of_burst": share, "rate": rate, "achieved_req_per_s": float(achieved),
                              "rows": table.to_dict(orient="records")})  # fmt: skip
    finally:
        for process in launched():
            await process.stop()
        await services.stop()
    fit = ProfiledTiming.fit(measured)
    errors = fit.residuals()
    return {
        "benchmark": "fidelity",
        "machine": machine(),
        "engine": f"{engine_name} (the built-in tiny model, CPU): its worker, the frontend and the client in three "
        "processes (etcd, TCP request plane); replayed on 1 mocker worker",
        "worker_environment": env,
        "limits": limits,
        "burst_req_per_s": capacity,
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
            f"{load['share_of_burst']:g}x": all(
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
    print(f"{result['engine']}: a burst answered at {result['burst_req_per_s']:.1f} req/s")
    for load in result["loads"]:
        print(f"\n{load['share_of_burst']:g}× that: {load['rate']:g} req/s offered, "
              f"{load['achieved_req_per_s']:.1f} answered; replay vs live, error %")  # fmt: skip
        print(f"  {'figure':18} {'live':>9} {'curves':>9} {'err %':>8} {'profiled':>9} {'err %':>8} "
              f"{'again':>9} {'err %':>8}")  # fmt: skip
        by = {(row["model"], row["figure"]): row for row in load["rows"]}
        for figure in (
            "ttft_p50_ms",
            "ttft_p90_ms",
            "itl_p50_ms",
            "itl_p90_ms",
            "output_tok_per_s",
            "ttft_mape_pct",
        ):
            curves, profiled, again = (
                by[(model, figure)] for model in ("Dynamo's curves", "profiled", "live again")
            )
            print(f"  {figure:18} {curves['live']:9.1f} {curves['replay']:9.1f} {curves['error_pct']:8.1f} "
                  f"{profiled['replay']:9.1f} {profiled['error_pct']:8.1f} "
                  f"{again['replay']:9.1f} {again['error_pct']:8.1f}")  # fmt: skip
    print(
        f"\nthe profiled model within the bars (TTFT/ITL p50 ±15 %, p90 ±25 %): {result['profiled_within_bars']}"
    )


if __name__ == "__main__":
    run_benchmark(__doc__, "fidelity", main, print_table, requests=400, requests_help="requests per load",
                  engines=("hf", "vllm"))  # fmt: skip
