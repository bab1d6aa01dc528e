"""``python -m dynamo_nb.bench``: a concurrency sweep from a shell; table, JSON and a chart.

    python -m dynamo_nb.bench --url http://127.0.0.1:8000 --model tiny-llama \\
        --concurrency 1,8,32 --requests 64 --max-tokens 32 --out results.json --plot chart.png
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import pandas as pd

from ..errors import ConfigError
from .arguments import comma_separated_sizes
from .charts import CHARTS
from .prompts import PROMPT_SETS, prompt_set
from .runner import ENDPOINTS, run
from .stats import save_json, summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb.bench",
        description="Load-test an OpenAI-compatible server: TTFT, inter-token latency, throughput.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the model name to ask for")
    parser.add_argument(
        "--concurrency", type=comma_separated_sizes, default=[1, 8, 32], help="levels, comma separated"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per level (default: 4 × level, ≥ 16)"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument(
        "--prompts", choices=sorted(PROMPT_SETS), default="random", help="built-in prompt set"
    )
    parser.add_argument("--num-prompts", type=int, default=100, help="prompts (conversations for multi-turn)")
    parser.add_argument("--prompt-words", type=int, default=64, help="words per user message")
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat", help="OpenAI route to call")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="ask for unary answers")
    parser.add_argument("--ignore-eos", action="store_true", help="ask for exactly max_tokens tokens")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature to send")
    parser.add_argument("--no-worker-ids", dest="worker_ids", action="store_false",
                        help="do not send nvext.extra_fields (for servers that reject unknown fields)")  # fmt: skip
    parser.add_argument("--label", default="", help="value of the label column")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take")
    parser.add_argument("--warmup", type=int, default=0, help="unrecorded requests before the sweep")
    parser.add_argument(
        "--new-connection", action="store_true", help="a new TCP connection per request (default: keep-alive)"
    )
    parser.add_argument("--out", default=None, help="write the summary and every request as JSON here")
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    parser.add_argument(
        "--chart", choices=sorted(CHARTS), default="ttft_itl", help="which chart --plot draws"
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def _prompts(args: argparse.Namespace) -> list:
    if args.prompts == "multi-turn":
        return prompt_set(args.prompts, conversations=args.num_prompts, words=args.prompt_words)
    if args.prompts == "shared-prefix":
        return prompt_set(args.prompts, n=args.num_prompts, user_words=args.prompt_words)
    return prompt_set(args.prompts, n=args.num_prompts, words=args.prompt_words)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        df = await run(
            args.url,
            args.model,
            prompts=_prompts(args),
            concurrency=args.concurrency,
            requests=args.requests,
            max_tokens=args.max_tokens,
            stream=args.stream,
            endpoint=args.endpoint,
            label=args.label,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            worker_ids=args.worker_ids,
            timeout=args.timeout,
            warmup=args.warmup,
            new_connection=args.new_connection,
            progress=args.progress,
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.precision", 1):
        print(summary(df))
    errors = df["error"].dropna()
    if len(errors):
        print(f"{len(errors)} of {len(df)} requests failed; first: {errors.iloc[0]}", file=sys.stderr)
    if args.out:
        print(
            f"wrote {save_json(df, args.out, **{k: v for k, v in vars(args).items() if k not in ('out', 'plot')})}"
        )
    if args.plot:
        CHARTS[args.chart](df).savefig(args.plot, dpi=100)
        print(f"wrote {args.plot}")
    return 1 if len(errors) == len(df) else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
