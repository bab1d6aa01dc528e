"""What the frontend's tokenizing costs a conversation each turn: the whole prompt tokenized (the
baseline, what the frontend did before and what a frontend without the cache does) against the
kit's tokenizer, which tokenizes only the pieces between added tokens it has not seen
(`dynamo_nb.llm.segment_cache`), in one process, the two interleaved turn by turn.

A conversation as an agent sends it: a system prompt of ~2,000 characters, then each turn the
whole history again with one new user message (~300 characters) and the answer before it
(~600 characters), rendered by the tiny model's chat template. Per turn (1, 10, 20 …): µs to
tokenize with each, and the ratio. Then new single-turn prompts (a ~60-character message each,
never seen): below the cache's `MIN_CHARS` they are tokenized whole, so the ratio is ~1.

    python benchmarks/tokenize_history.py [--requests 40]   # turns of the conversation
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb.llm.tokenizer import ModelTokenizer
from dynamo_nb.models import tiny_model_path

REPEATS = 9  # tokenizings of each prompt by each side; the median is kept
SHORT_PROMPTS = 2000
WORDS = "robot library shelf atlas quiet story reader lamp index page chapter dust window".split()


def _words(rng: random.Random, characters: int) -> str:
    text = []
    while sum(map(len, text)) < characters:
        text.append(rng.choice(WORDS))
    return " ".join(text)


def _median_us(tokenize: Any, text: str) -> float:
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        tokenize(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def main(turns: int) -> dict[str, Any]:
    rng = random.Random(0)
    cached = ModelTokenizer.load(tiny_model_path())
    whole = ModelTokenizer.load(tiny_model_path()).tokenizer
    if cached.segments is None:
        raise SystemExit("the tiny model's tokenizer should take the segment cache")

    def baseline(text: str) -> list[int]:
        return whole.encode_batch_fast([text])[0].ids

    history = [{"role": "system", "content": _words(rng, 2000)}]
    rows = []
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": _words(rng, 300)})
        prompt = cached.render_chat(history)
        first = cached.encode(prompt)  # the turn as the frontend meets it: its new pieces tokenized
        if first != baseline(prompt):
            raise RuntimeError(f"turn {turn}: the cache's ids differ from the tokenizer's")
        rows.append({
            "turn": turn,
            "prompt_tokens": len(first),
            "whole_us": _median_us(baseline, prompt),
            "cached_us": _median_us(cached.encode, prompt),  # every piece known: the next request's case
        })  # fmt: skip
        history.append({"role": "assistant", "content": _words(rng, 600)})
    # what a new turn costs: its new pieces tokenized, the rest found (timed once per turn above
    # as "first"; measured here apart, on a fresh conversation, each turn timed as it first comes)
    fresh = ModelTokenizer.load(tiny_model_path())
    assert fresh.segments is not None  # built (its probes run) before the clock starts
    warm = [{"role": "system", "content": _words(rng, 2000)}, {"role": "user", "content": _words(rng, 300)}]
    fresh.encode(fresh.render_chat(warm))  # its first encode's one-time costs paid, as the baseline's were
    fresh.segments.clear()  # and nothing of this conversation known
    history = [{"role": "system", "content": _words(random.Random(1), 2000)}]
    for row in rows:
        history.append({"role": "user", "content": _words(rng, 300)})
        prompt = fresh.render_chat(history)
        started = time.perf_counter()
        fresh.encode(prompt)
        row["new_turn_us"] = (time.perf_counter() - started) * 1e6
        history.append({"role": "assistant", "content": _words(rng, 600)})
        row["ratio"] = row["new_turn_us"] / row["whole_us"]
    shorts = [
        cached.render_chat([{"role": "user", "content": f"{_words(rng, 60)} ({i})"}])
        for i in range(SHORT_PROMPTS)
    ]
    short_whole, short_cached = [], []
    for text in shorts:  # interleaved: a drift of the machine reaches both alike
        short_whole.append(_median_us(baseline, text))
        short_cached.append(_median_us(cached.encode, text))
    short = {"prompts": SHORT_PROMPTS, "whole_us": statistics.median(short_whole),
             "cached_us": statistics.median(short_cached)}  # fmt: skip
    short["ratio"] = short["cached_us"] / short["whole_us"]
    return {
        "benchmark": "tokenize_history",
        "machine": machine(),
        "setup": "the tiny model's tokenizer in one process: a conversation of a ~2,000-character system "
        "prompt and ~900 characters a turn, the whole history each turn; new ~60-character prompts",
        "turns": rows,
        "short_new_prompts": short,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'turn':>5} {'tokens':>7} {'whole µs':>10} {'new turn µs':>12} {'ratio':>6} {'all known µs':>13}")
    for row in result["turns"]:
        if row["turn"] in (1, 2, 5) or row["turn"] % 10 == 0:
            print(f"{row['turn']:>5} {row['prompt_tokens']:>7} {row['whole_us']:>10.0f} {row['new_turn_us']:>12.0f} "
                  f"{row['ratio']:>6.2f} {row['cached_us']:>13.0f}")  # fmt: skip
    short = result["short_new_prompts"]
    print(f"new short prompts: {short['whole_us']:.1f} µs whole, {short['cached_us']:.1f} µs through the cache "
          f"({short['ratio']:.2f}×)")  # fmt: skip


if __name__ == "__main__":
    run_benchmark(__doc__, "tokenize_history", main, print_table, requests=40,
                  requests_help="turns of the conversation")  # fmt: skip
