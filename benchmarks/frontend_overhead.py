"""What the OpenAI frontend costs, against the worker endpoint asked straight, in the same run.

Part 1 (real model): an hf worker (built-in tiny model) and a frontend, each its own process,
over etcd + TCP. A greedy 32-token streamed chat request is sent N times through the
frontend (HTTP + SSE) and N times straight to the worker endpoint (the same token ids as a
PreprocessedRequest over the TCP plane). TTFT and end-to-end medians, ratio frontend/direct.

Part 2 (zero-cost engine): an echo worker and a frontend, each its own process. Requests/s at
concurrency 1, 8, 32 and 128 with 32-token streams, through the frontend and straight to the
worker endpoint; the ratio, and the frontend process's CPU time per request.

Part 3 (what explaining requests costs): three frontends on the same echo worker, one with
nothing kept (``--routing-records 0``), one keeping routing decisions (the default), one keeping
them and exporting OpenTelemetry spans (``DYN_NB_TRACE=jsonl:DIR``). The frontend process's CPU
per request at concurrency 8, in interleaved rounds; the ratios to the first.

Part 4 (per token, per request): the frontend on the echo worker and bare aiohttp streaming
the same event template with nothing behind it (``_bare_sse.py``), each its own process, at
concurrency 128: the server's CPU per request with 1-token streams (the fixed cost) and with
256-token streams; per token = (256-token − 1-token) / 255. Interleaved rounds, medians.

    python benchmarks/frontend_overhead.py [--requests 40] [--out benchmarks/results/frontend_overhead.json]
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _harness import machine, run_benchmark

from dynamo_nb import DistributedRuntime, LocalServices, ManagedProcess, launch
from dynamo_nb.llm import ModelTokenizer
from dynamo_nb.models import tiny_model_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOKENS = 32
CONCURRENCY = (1, 8, 32, 128)
MESSAGES = [{"role": "user", "content": "Tell me a story about a small robot in a quiet library."}]
_NUMBERS = itertools.count()


def numbered(messages: Any) -> list[Any]:
    """``messages`` with the last one's text numbered, a new number each call: no two requests are
    alike, as in real traffic, so the frontend's tokenizer finds no piece of a prompt it has seen
    (`dynamo_nb.llm.segment_cache`) and pays for tokenizing each, as Dynamo's does."""
    *earlier, last = messages
    return [*earlier, {**last, "content": f"{last['content']} ({next(_NUMBERS)})"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start(*argv: str, env: dict[str, str] | None = None) -> ManagedProcess:
    """A component as its own process (quiet logs), once it prints READY."""
    return await launch(*argv, "--log-level", "WARNING", cwd=ROOT, show_logs=False, timeout=90, env=env)


async def wait_for_model(http: aiohttp.ClientSession, url: str, name: str) -> None:
    for _ in range(300):
        async with http.get(f"{url}/v1/models") as response:
            if name in [m["id"] for m in (await response.json())["data"]]:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{name} never appeared at {url}")


ECHO = "dyn://bench.echo.generate"  # the echo worker the frontend benchmarks serve


async def start_echo(etcd: list[str]) -> ManagedProcess:
    """The echo worker at `ECHO` (a zero-cost engine), once it serves."""
    return await start("-m", "dynamo_nb", "run", "--in", ECHO, "--out", "echo", *etcd)


@dataclass
class EchoStack:
    """etcd, a client session and the echo worker (``programs[0]``), from `echo_stack`; a
    program appended to ``programs`` is stopped with them."""

    etcd: list[str]
    http: aiohttp.ClientSession
    programs: list[ManagedProcess]


@contextlib.asynccontextmanager
async def echo_stack() -> AsyncIterator[EchoStack]:
    """Start etcd, a client session and the echo worker; on the way out stop every program in
    ``programs``, last first, then the session and etcd.

    Example::

        async with echo_stack() as stack:
            frontend, url = await start_echo_frontend(stack.http, stack.etcd)
            stack.programs.append(frontend)
    """
    services = await LocalServices.start(nats=False)
    http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
    )
    stack = EchoStack(["--discovery", services.etcd_url or ""], http, [])
    try:
        stack.programs.append(await start_echo(stack.etcd))
        yield stack
    finally:
        await http.close()
        for program in reversed(stack.programs):
            await program.stop()
        await services.stop()


async def start_echo_frontend(
    http: aiohttp.ClientSession, etcd: list[str], *flags: str, program: tuple[str, ...] = ("-m", "dynamo_nb")
) -> tuple[ManagedProcess, str]:
    """A frontend process on `ECHO` with ``flags`` on a free port: it and its URL, once it serves the
    model. ``program``: what runs ``python -m dynamo_nb``'s arguments (a wrapper such as
    ``_cpu_sampler.py OUTPUT``)."""
    port = free_port()
    frontend = await start(
        *program, "run", "--in", "http", "--out", ECHO, *etcd, "--http-port", str(port), *flags
    )
    url = f"http://127.0.0.1:{port}"
    await wait_for_model(http, url, "tiny-llama")
    return frontend, url


async def via_frontend(http: aiohttp.ClientSession, url: str, model: str) -> tuple[float, float, int]:
    """One streamed chat request: (TTFT, end-to-end, completion tokens from the usage chunk).

    TTFT is the first chunk with text; a token without text (a special token) sends no chunk."""
    body = {
        "model": model,
        "messages": numbered(MESSAGES),
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(await response.text())
        async for line in response.content:
            if not first and line.startswith(b"data: {") and b'"content":"' in line and b'"role"' not in line:
                first = time.perf_counter() - start
            elif line.startswith(b"data: {") and b'"usage":{' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return first, time.perf_counter() - start, tokens


async def direct(client: Any, token_ids: list[int]) -> tuple[float, float, int]:
    """The same request straight to the worker endpoint: (TTFT, end-to-end, items)."""
    request = {
        "token_ids": token_ids,
        "stop_conditions": {"max_tokens": TOKENS, "ignore_eos": True},
        "sampling_options": {"temperature": 0},
    }
    start = time.perf_counter()
    first = 0.0
    items = 0
    async for _ in client.round_robin(request):
        items += 1
        if not first:
            first = time.perf_counter() - start
    return first, time.perf_counter() - start, items


async def sequential(call: Any, n: int) -> dict[str, float]:
    results = [await call() for _ in range(n)]
    assert all(r[2] >= TOKENS - 1 for r in results), (
        "a stream came back short"
    )  # r[2]: tokens (frontend) or items (endpoint)
    return {
        "ttft_p50_ms": statistics.median(r[0] for r in results) * 1e3,
        "e2e_p50_ms": statistics.median(r[1] for r in results) * 1e3,
    }


async def throughput(call: Any, concurrency: int, total: int) -> float:
    done = 0

    async def user() -> None:
        nonlocal done
        while done < total:
            done += 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


async def main(requests: int) -> dict[str, Any]:
    model_path = tiny_model_path()
    tokenizer = ModelTokenizer.load(model_path)
    token_ids = tokenizer.encode(tokenizer.render_chat(MESSAGES), add_special_tokens=False)
    services = await LocalServices.start(nats=False)
    etcd = ["--discovery", services.etcd_url]
    programs: list[ManagedProcess] = []
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp")
    connector = aiohttp.TCPConnector(limit=0)
    http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))
    report: dict[str, Any] = {}
    try:
        # part 1: the tiny model
        hf_port = free_port()
        programs.append(await start("components/hf_worker.py", *etcd, "--endpoint", "bench.hf.generate"))
        programs.append(await start("components/frontend.py", *etcd, "--http-port", str(hf_port)))
        hf_url = f"http://127.0.0.1:{hf_port}"
        await wait_for_model(http, hf_url, "tiny-llama")
        hf_client = await runtime.endpoint("bench.hf.generate").client()
        await hf_client.wait_for_instances(timeout=30)
        for _ in range(3):  # warm both paths
            await via_frontend(http, hf_url, "tiny-llama")
            await direct(hf_client, token_ids)
        fe = await sequential(lambda: via_frontend(http, hf_url, "tiny-llama"), requests)
        dr = await sequential(lambda: direct(hf_client, token_ids), requests)
        report["hf_stream"] = {
            "frontend": fe,
            "direct": dr,
            "ttft_ratio": fe["ttft_p50_ms"] / dr["ttft_p50_ms"],
            "e2e_ratio": fe["e2e_p50_ms"] / dr["e2e_p50_ms"],
        }
        for program in programs:
            await program.stop()
        programs.clear()

        # part 2: zero-cost echo engine
        programs.append(await start_echo(etcd))
        frontend, echo_url = await start_echo_frontend(http, etcd)
        programs.append(frontend)
        echo_client = await runtime.endpoint("bench.echo.generate").client()
        await echo_client.wait_for_instances(timeout=30)
        rows = []
        for concurrency in CONCURRENCY:
            total = max(100, concurrency * 6)
            await throughput(lambda: via_frontend(http, echo_url, "tiny-llama"), concurrency, concurrency)
            cpu = frontend.cpu_seconds()
            fe_rps = await throughput(lambda: via_frontend(http, echo_url, "tiny-llama"), concurrency, total)
            cpu_ms = (frontend.cpu_seconds() - cpu) / total * 1e3
            dr_rps = await throughput(lambda: direct(echo_client, token_ids), concurrency, total)
            rows.append(
                {
                    "concurrency": concurrency,
                    "requests": total,
                    "frontend_rps": fe_rps,
                    "direct_rps": dr_rps,
                    "ratio": fe_rps / dr_rps,
                    "frontend_cpu_ms_per_request": cpu_ms,
                }
            )
        report["echo_throughput"] = rows
        report["per_token"] = await per_token_cost(http, frontend, echo_url)
        report["observability"] = await observability_cost(http, etcd)
    finally:
        await http.close()
        for program in programs:
            await program.stop()
        await runtime.shutdown()
        await services.stop()

    report["setup"] = {
        "machine": machine(),
        "requests_sequential": requests,
        "tokens_per_stream": TOKENS,
        "note": "client (this process), frontend and worker share the machine's cores",
    }
    return report


LONG, SHORT = 256, 1  # tokens per stream of part 4
PER_TOKEN_CONCURRENCY = 128


def stream_body(tokens: int, messages: Any = MESSAGES) -> dict[str, Any]:
    """A streamed chat request's body for ``tokens`` tokens of ``messages``' answer (`numbered`)."""
    return {
        "model": "tiny-llama",
        "messages": numbered(messages),
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def stream_tokens(http: aiohttp.ClientSession, url: str, tokens: int, messages: Any = MESSAGES) -> None:
    """One streamed chat request of ``tokens`` tokens, read to its end (a token without text,
    such as the echoed chat template's markers, sends no event)."""
    body = stream_body(tokens, messages)
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(await response.text())
        last = b""
        async for line in response.content:
            last = line if line.strip() else last
    if last.strip() != b"data: [DONE]":
        raise RuntimeError(f"{url} ended a stream without [DONE]")


async def per_token_cost(http: aiohttp.ClientSession, frontend: ManagedProcess, url: str) -> dict[str, Any]:
    """Part 4: CPU per request (1-token streams) and per token, ours against bare aiohttp."""
    port = free_port()
    bare = await launch("benchmarks/_bare_sse.py", port, cwd=ROOT, show_logs=False, timeout=30)
    servers = {"frontend": (frontend, url), "bare_aiohttp": (bare, f"http://127.0.0.1:{port}")}
    samples: dict[str, dict[int, list[float]]] = {name: {LONG: [], SHORT: []} for name in servers}
    try:
        for _ in range(ROUNDS):
            for name, (process, server_url) in servers.items():
                for tokens, total in ((SHORT, 1024), (LONG, 256)):
                    call = functools.partial(stream_tokens, http, server_url, tokens)
                    await throughput(call, PER_TOKEN_CONCURRENCY, PER_TOKEN_CONCURRENCY)
                    cpu = process.cpu_seconds()
                    await throughput(call, PER_TOKEN_CONCURRENCY, total)
                    samples[name][tokens].append((process.cpu_seconds() - cpu) / total * 1e3)
    finally:
        await bare.stop()
    result: dict[str, Any] = {
        "concurrency": PER_TOKEN_CONCURRENCY,
        "rounds": ROUNDS,
        "cpu_ms_rounds": samples,
    }
    for name in servers:
        per_request = statistics.median(samples[name][SHORT])
        per_long = statistics.median(samples[name][LONG])
        result[name] = {
            "cpu_ms_per_request": per_request,
            "cpu_ms_per_256_token_request": per_long,
            "cpu_us_per_token": (per_long - per_request) / (LONG - SHORT) * 1e3,
        }
    result["per_token_ratio"] = (
        result["frontend"]["cpu_us_per_token"] / result["bare_aiohttp"]["cpu_us_per_token"]
    )
    result["per_request_ratio"] = (
        result["frontend"]["cpu_ms_per_request"] / result["bare_aiohttp"]["cpu_ms_per_request"]
    )
    return result


OBSERVED = 8  # concurrency of the observability comparison
ROUNDS = 3


async def observability_cost(http: aiohttp.ClientSession, etcd: list[str]) -> dict[str, Any]:
    """Part 3: the frontend's CPU per request with nothing kept, routing records, records and spans."""
    settings = {
        "off": ({}, ["--routing-records", "0"]),
        "records": ({}, []),
        "records_and_spans": ({"DYN_NB_TRACE": f"jsonl:{tempfile.mkdtemp(prefix='dynamo_nb_spans_')}"}, []),
    }
    frontends: dict[str, tuple[ManagedProcess, str]] = {}
    try:
        for name, (env, flags) in settings.items():
            port = free_port()
            process = await start("components/frontend.py", *etcd, "--http-port", str(port), *flags, env=env)
            frontends[name] = (process, f"http://127.0.0.1:{port}")
            await wait_for_model(http, frontends[name][1], "tiny-llama")
        samples: dict[str, list[float]] = {name: [] for name in settings}
        total = 200
        for _ in range(ROUNDS):  # interleaved, so drift on the machine hits each setting alike
            for name, (process, url) in frontends.items():
                await throughput(lambda url=url: via_frontend(http, url, "tiny-llama"), OBSERVED, OBSERVED)
                cpu = process.cpu_seconds()
                await throughput(lambda url=url: via_frontend(http, url, "tiny-llama"), OBSERVED, total)
                samples[name].append((process.cpu_seconds() - cpu) / total * 1e3)
    finally:
        for process, _url in frontends.values():
            await process.stop()
    cpu_ms = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "concurrency": OBSERVED,
        "requests_per_round": total,
        "rounds": ROUNDS,
        "cpu_ms_per_request": cpu_ms,
        "cpu_ms_per_request_rounds": samples,
        "records_ratio": cpu_ms["records"] / cpu_ms["off"],
        "records_and_spans_ratio": cpu_ms["records_and_spans"] / cpu_ms["off"],
    }


def print_table(report: dict[str, Any]) -> None:
    hf = report["hf_stream"]
    print(
        f"\nTiny model, {TOKENS}-token greedy stream, p50 over {report['setup']['requests_sequential']} requests"
    )
    print(f"{'path':<28}{'TTFT ms':>10}{'end-to-end ms':>16}")
    print(
        f"{'frontend (HTTP/SSE)':<28}{hf['frontend']['ttft_p50_ms']:>10.2f}{hf['frontend']['e2e_p50_ms']:>16.2f}"
    )
    print(
        f"{'worker endpoint (TCP)':<28}{hf['direct']['ttft_p50_ms']:>10.2f}{hf['direct']['e2e_p50_ms']:>16.2f}"
    )
    print(f"{'ratio':<28}{hf['ttft_ratio']:>10.2f}{hf['e2e_ratio']:>16.2f}")
    print(f"\nEcho engine, {TOKENS}-token streams: requests/s")
    print(f"{'concurrency':>11}{'frontend':>11}{'direct':>10}{'ratio':>8}{'frontend CPU ms/req':>22}")
    for row in report["echo_throughput"]:
        print(
            f"{row['concurrency']:>11}{row['frontend_rps']:>11.1f}{row['direct_rps']:>10.1f}{row['ratio']:>8.2f}"
            f"{row['frontend_cpu_ms_per_request']:>22.3f}"
        )
    cost = report["per_token"]
    print(f"\nServer CPU, concurrency {cost['concurrency']}, median of {cost['rounds']} interleaved rounds")
    print(f"{'server':<16}{'ms per request (1 token)':>26}{'µs per token (256)':>20}")
    for name in ("frontend", "bare_aiohttp"):
        print(f"{name:<16}{cost[name]['cpu_ms_per_request']:>26.3f}{cost[name]['cpu_us_per_token']:>20.2f}")
    print(f"{'ratio':<16}{cost['per_request_ratio']:>26.2f}{cost['per_token_ratio']:>20.2f}")
    seen = report["observability"]
    print(f"\nWhat explaining requests costs: frontend CPU ms per request, concurrency {seen['concurrency']}, "
          f"median of {seen['rounds']} interleaved rounds")  # fmt: skip
    print(f"{'setting':<22}{'CPU ms/req':>12}{'ratio':>8}")
    for name, value in seen["cpu_ms_per_request"].items():
        print(f"{name:<22}{value:>12.3f}{value / seen['cpu_ms_per_request']['off']:>8.2f}")


if __name__ == "__main__":
    run_benchmark(
        __doc__,
        "frontend_overhead",
        main,
        print_table,
        requests=40,
        requests_help="sequential requests per path",
    )
