"""The hf engine under bursts of requests, against its one-prompt-per-step self and transformers'
own ``generate``, on one device in one run.

One model in this process (the built-in tiny model, or a random Llama of ``--params`` size with the
built-in tokenizer: no hub), one engine, run three ways at each concurrency c:

- **batched** (the default): a step's waiting prompts prefill together in one forward pass (on a
  CPU the short ones: ``prefill_passes``) under
  ``--max-num-batched-tokens`` (2048), long ones in chunks, decodes batched, one host sync a step;
- **one prompt per step** (the baseline: ``max_num_batched_tokens=1``, no chunking): a step
  prefills a single prompt, as the engine did before prompts were batched;
- transformers' ``generate`` on a static batch of the same c prompts (greedy, the same lengths):
  its output tokens/s, the usual "just call generate" reference.

A burst is c requests sent at once (prompts of each ``--prompt-tokens`` length, random ids; ``--tokens``
output tokens each, eos ignored); each level runs a warm-up burst of each way and then ``--bursts``
measured ones of each, the two ways interleaved and their order swapped every round (so neither
gains from running second: a lone request, which runs the same steps either way, measures level). Reported per level and way: TTFT p50/p90, ITL p50/p99 (ms), output tokens/s; ratios
batched / baseline and batched / generate. Writes ``benchmarks/results/hf_engine.json`` (or
``hf_engine_<device>.json`` off CPU) with the device's name.

    python benchmarks/hf_engine.py                                  # CPU, the tiny model, c = 1, 8
    python benchmarks/hf_engine.py --device cuda --params 0.6B --levels 1,8,32,64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from _harness import RESULTS, machine

from dynamo_nb.engines import HFEngine
from dynamo_nb.llm import PreprocessedRequest, SamplingOptions, StopConditions
from dynamo_nb.models import tiny_model_path

SHAPES = {  # --params: (layers, hidden, intermediate, heads, kv heads) of a random Llama
    "0.1B": (12, 768, 2048, 12, 4),
    "0.6B": (24, 1536, 4096, 12, 4),
    "1B": (16, 2048, 8192, 32, 8),
}
WAYS = {"batched": (2048, True), "one_prompt_per_step": (1, False)}


def build_model(params: str, device: str) -> tuple[Any, str]:
    """The model on ``device``: the built-in tiny model (``tiny``) or a random Llama; its description."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if params == "tiny":
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=dtype).to(device).eval()
        return model, "the built-in tiny model"
    if params not in SHAPES:
        raise SystemExit(f"--params {params!r}: use tiny or one of {', '.join(SHAPES)}")
    layers, hidden, intermediate, heads, kv_heads = SHAPES[params]
    tiny = LlamaConfig.from_pretrained(tiny_model_path())
    config = LlamaConfig(
        vocab_size=tiny.vocab_size, max_position_embeddings=4096, hidden_size=hidden,
        intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, eos_token_id=tiny.eos_token_id, pad_token_id=tiny.pad_token_id,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    count = sum(p.numel() for p in model.parameters())
    return model, f"a random Llama, {count / 1e6:.0f} M parameters ({layers} layers, hidden {hidden})"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


async def burst(engine: HFEngine, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """Send every prompt at once; each request's TTFT and inter-token gaps, tokens and wall time."""

    async def one(ids: list[int]) -> tuple[float, list[float], int]:
        request = PreprocessedRequest(
            ids, StopConditions(max_tokens=tokens, ignore_eos=True), SamplingOptions(temperature=0)
        )
        sent = last = time.perf_counter()
        ttft, gaps, produced = 0.0, [], 0
        async for output in engine.generate(request):
            now = time.perf_counter()
            if produced == 0:
                ttft = now - sent
            elif output.token_ids:
                gaps.append(now - last)
            last = now
            produced += len(output.token_ids)
        return ttft, gaps, produced

    started = time.perf_counter()
    results = await asyncio.gather(*(one(ids) for ids in prompts))
    return {
        "ttft": [r[0] for r in results],
        "itl": [gap for r in results for gap in r[1]],
        "tokens": sum(r[2] for r in results),
        "seconds": time.perf_counter() - started,
    }


def generate_tok_per_s(model: Any, prompts: list[list[int]], tokens: int, bursts: int) -> float:
    """transformers' ``generate`` on the prompts as one static batch (greedy, ``tokens`` each)."""
    import torch

    ids = torch.tensor(prompts, device=model.device)
    settings = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False,
                "pad_token_id": 0, "attention_mask": torch.ones_like(ids)}  # fmt: skip
    with torch.inference_mode():
        model.generate(ids, **settings)  # warm-up
        synchronize(model)
        started = time.perf_counter()
        for _ in range(bursts):
            model.generate(ids, **settings)
        synchronize(model)
    return bursts * len(prompts) * tokens / (time.perf_counter() - started)


def join_cost_ms(model: Any, members: int, prompt_tokens: int, reps: int = 5) -> dict[str, float]:
    """Milliseconds for one sequence to join a decode batch of ``members``: copying in the joining
    row only (the engine's way) against restacking every member (the way before)."""
    import torch

    from dynamo_nb.engines.hf_batch import DecodeBatch
    from dynamo_nb.engines.hf_prefill import PrefillRow, prefill_rows
    from dynamo_nb.engines.model_calls import new_kv_cache

    with torch.inference_mode():
        rows = [
            PrefillRow(new_kv_cache(model), list(range(3, 3 + prompt_tokens))) for _ in range(members + 1)
        ]
        caches = prefill_rows(model, rows)[1]
        batch = DecodeBatch(model)
        timings: dict[str, float] = {}
        for way in ("join_one", "restack_all", "join_one", "restack_all"):  # the second round is measured
            total = 0.0
            for _ in range(reps):
                batch.clear()
                batch.update(set(), list(enumerate(caches[:members])))
                synchronize(model)
                started = time.perf_counter()
                if way == "join_one":
                    batch.update(set(range(members)), [(members, caches[members])])
                else:
                    batch.clear()
                    batch.update(set(), list(enumerate(caches)))
                synchronize(model)
                total += time.perf_counter() - started
            timings[f"{way}_ms"] = total / reps * 1000
    return timings


def synchronize(model: Any) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import random

    import torch

    model, described = build_model(args.params, args.device)
    engine = HFEngine(model, device=args.device, eos_token_ids=[], max_num_seqs=max(args.levels))
    rng = random.Random(0)
    vocab = model.config.vocab_size
    rows = []
    try:
        for prompt_tokens, level in [(n, c) for n in args.prompt_tokens for c in args.levels]:
            prompts = [[rng.randrange(3, vocab) for _ in range(prompt_tokens)] for _ in range(level)]
            row: dict[str, Any] = {"prompt_tokens": prompt_tokens, "concurrency": level}
            scheduler = engine.scheduler
            measured: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
            for round_ in range(args.bursts + 1):  # the ways interleaved, their order swapped each round
                for way in list(WAYS)[:: 1 if round_ % 2 else -1]:
                    scheduler.max_num_batched_tokens, scheduler.enable_chunked_prefill = WAYS[way]
                    run = await burst(engine, prompts, args.tokens)
                    if round_:  # the first round warms both up
                        measured[way].append(run)
            for way, runs in measured.items():
                ttft = [t * 1000 for run in runs for t in run["ttft"]]
                itl = [t * 1000 for run in runs for t in run["itl"]]
                row[way] = {
                    "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p90_ms": percentile(ttft, 0.9),
                    "itl_p50_ms": percentile(itl, 0.5), "itl_p99_ms": percentile(itl, 0.99),
                    "tok_per_s": sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs),
                }  # fmt: skip
            row["generate_tok_per_s"] = generate_tok_per_s(model, prompts, args.tokens, args.bursts)
            row["join"] = join_cost_ms(model, level, prompt_tokens)
            batched, baseline = row["batched"], row["one_prompt_per_step"]
            row["ttft_p50_baseline_over_batched"] = baseline["ttft_p50_ms"] / batched["ttft_p50_ms"]
            row["tok_per_s_batched_over_baseline"] = batched["tok_per_s"] / baseline["tok_per_s"]
            row["tok_per_s_batched_over_generate"] = batched["tok_per_s"] / row["generate_tok_per_s"]
            row["itl_p99_over_p50"] = batched["itl_p99_ms"] / batched["itl_p50_ms"]
            rows.append(row)
            print_row(row)
    finally:
        await engine.close()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else machine()
    return {
        "rows": rows,
        "setup": {
            "device": args.device, "device_name": device_name, "machine": machine(),
            "model": described, "dtype": str(next(model.parameters()).dtype),
            "prompt_tokens": args.prompt_tokens, "tokens_per_request": args.tokens, "bursts": args.bursts,
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        },
    }  # fmt: skip


def print_row(row: dict[str, Any]) -> None:
    if row["concurrency"] == 1 or not hasattr(print_row, "header"):
        print_row.header = True  # type: ignore[attr-defined]
        print(f"\nprompts of {row['prompt_tokens']} tokens")
        print(f"{'c':>4} {'way':<20}{'TTFT p50':>9}{'p90':>8}{'ITL p50':>9}{'p99':>8}{'tok/s':>9}")
    for way in WAYS:
        r = row[way]
        print(
            f"{row['concurrency']:>4} {way:<20}{r['ttft_p50_ms']:>9.1f}{r['ttft_p90_ms']:>8.1f}"
            f"{r['itl_p50_ms']:>9.2f}{r['itl_p99_ms']:>8.2f}{r['tok_per_s']:>9.0f}"
        )
    print(f"{row['concurrency']:>4} {'generate (static)':<20}{'':>34}{row['generate_tok_per_s']:>9.0f}")
    join = row["join"]
    print(
        f"     a sequence joining {row['concurrency']} decoding: {join['join_one_ms']:.2f} ms copying it in, "
        f"{join['restack_all_ms']:.2f} ms restacking all"
    )
    print(
        f"     TTFT p50 baseline/batched {row['ttft_p50_baseline_over_batched']:.2f}x, tok/s batched/"
        f"baseline {row['tok_per_s_batched_over_baseline']:.2f}x, batched/generate "
        f"{row['tok_per_s_batched_over_generate']:.2f}x, ITL p99/p50 {row['itl_p99_over_p50']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda[:N] (default: %(default)s)")
    parser.add_argument(
        "--params", default="tiny", help=f"tiny | {' | '.join(SHAPES)} (default: %(default)s)"
    )
    parser.add_argument(
        "--levels", default="1,8", help="concurrencies, comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--prompt-tokens", default="32,128", help="prompt lengths, comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--tokens", type=int, default=64, help="output tokens a request (default: %(default)s)"
    )
    parser.add_argument(
        "--bursts", type=int, default=3, help="measured bursts a level (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where the JSON goes")
    args = parser.parse_args()
    args.levels = [int(level) for level in args.levels.split(",")]
    args.prompt_tokens = [int(length) for length in args.prompt_tokens.split(",")]
    out = args.out or RESULTS / (
        "hf_engine.json" if args.device == "cpu" else f"hf_engine_{args.device.split(':')[0]}.json"
    )
    result = asyncio.run(measure(args))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
