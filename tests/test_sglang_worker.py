"""The SGLang worker as real processes, against SGLang's recording stand-in (SGLang needs a GPU).

The worker processes, etcd, NATS and the frontend are real; only ``sglang.Engine`` is the
stand-in (`dynamo_nb.engines.sglang_fake`), which records what it is sent (``--fake-record``)
and moves the prompt's "KV" between prefill and decode by bootstrap room, as SGLang does. So
these tests check what we send SGLang: the room flow of the fast and fallback paths, the
decode's own prefill, aborts on both legs, and what a failed prefill becomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, collect, free_port

from dynamo_nb import DistributedRuntime, launch

pytestmark = pytest.mark.timeout(180)

SGLANG_WORKER = ROOT / "components" / "sglang_worker.py"
PROMPT = list(range(10, 60))


def records(path: Path, call: str = "async_generate") -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [entry for entry in entries if entry["call"] == call]


@pytest.fixture(scope="module")
async def graph(services: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """Four model graphs behind two frontends, every worker on the stand-in:

    - ``tiny-llama``: prefill + decode, the prefill publishes SGLang's bootstrap server (fast path);
    - ``tiny-fallback``: prefill with ``--no-bootstrap-endpoint`` + decode (fallback path);
    - ``tiny-broken``: a prefill whose every prefill fails + decode;
    - ``tiny-agg``: one aggregated worker (``--disaggregation-mode null``).
    The second frontend runs with ``--enforce-disagg``."""
    logs = tmp_path_factory.mktemp("sglang")
    common = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--fake-engine"]

    def worker(name: str, namespace: str, model: str, *flags: str) -> Any:
        record = logs / f"{name}.jsonl"
        endpoints = [
            "--endpoint",
            f"{namespace}.backend.generate",
            "--prefill-endpoint",
            f"{namespace}.prefill.generate",
        ]
        return launch(
            SGLANG_WORKER,
            *common,
            *endpoints,
            "--model-name",
            model,
            "--fake-record",
            str(record),
            *flags,
            cwd=ROOT,
            log_dir=logs,
            show_logs=False,
            timeout=60,
            name=f"sglang-{name}",
        )

    def prefill(*flags: str) -> tuple[str, ...]:
        return (
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(free_port()),
            *flags,
        )

    decode = ("--disaggregation-mode", "decode")
    processes = await asyncio.gather(
        worker("prefill", "dynamo", "tiny-llama", *prefill("--fake-prefill-delay", "0.6")),
        worker("decode", "dynamo", "tiny-llama", *decode),
        worker("fb-prefill", "fb", "tiny-fallback", *prefill("--no-bootstrap-endpoint")),
        worker("fb-decode", "fb", "tiny-fallback", *decode),
        worker("bad-prefill", "bad", "tiny-broken", *prefill("--fake-fail-prefill")),
        worker("bad-decode", "bad", "tiny-broken", *decode),
        worker("agg", "agg", "tiny-agg"),
    )
    ports = [free_port(), free_port()]
    frontends = await asyncio.gather(
        *(
            launch(
                FRONTEND,
                "--discovery",
                services.etcd_url,
                "--nats-url",
                services.nats_url,
                "--http-port",
                str(port),
                *extra,
                cwd=ROOT,
                log_dir=logs,
                show_logs=False,
                timeout=60,
            )
            for port, extra in zip(ports, ([], ["--enforce-disagg"]), strict=True)
        )
    )
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    wanted = {"tiny-llama", "tiny-fallback", "tiny-broken", "tiny-agg"}
    disaggregated = {"tiny-llama", "tiny-fallback", "tiny-broken"}
    async with httpx.AsyncClient(timeout=5) as http:
        for url in urls:
            for _ in range(200):  # every model listed, and the prefill workers of each known
                health = (await http.get(f"{url}/health")).json()
                if wanted <= set(health["models"]) and disaggregated <= {
                    i["model"] for i in health["prefill_instances"]
                }:
                    break
                await asyncio.sleep(0.1)
    yield {"logs": logs, "url": urls[0], "enforced_url": urls[1], "runtime": runtime}
    await runtime.shutdown(grace=0.5)
    await asyncio.gather(*(process.stop(timeout=10) for process in (*frontends, *processes)))


async def complete(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, **extra}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        return await http.post("/v1/completions", json=body)


async def test_fast_path_sends_the_routers_room_to_both_legs(graph: dict[str, Any]) -> None:
    response = await complete(graph["url"], "tiny-llama")
    assert response.status_code == 200, response.text
    assert response.headers["x-dynamo-path"] == "fast"
    room = int(response.headers["x-dynamo-bootstrap-room"])
    (prefill,) = [c for c in records(graph["logs"] / "prefill.jsonl") if c["bootstrap_room"] == room]
    (decode,) = [c for c in records(graph["logs"] / "decode.jsonl") if c["bootstrap_room"] == room]
    # both legs: the frontend's room, the prefill's bootstrap server, the prompt as token ids
    assert prefill["bootstrap_host"] == decode["bootstrap_host"] == "127.0.0.1"
    assert prefill["bootstrap_port"] == decode["bootstrap_port"]
    assert prefill["prompt_tokens"] == decode["prompt_tokens"] == len(PROMPT)
    assert prefill["stream"] is decode["stream"] is True
    assert prefill["sampling_params"]["max_new_tokens"] == 1  # the prefill computes the first token only
    assert decode["sampling_params"]["max_new_tokens"] == 12 and decode["sampling_params"]["temperature"] == 0
    # the same greedy text as one aggregated worker
    aggregated = await complete(graph["url"], "tiny-agg")
    assert aggregated.headers.get("x-dynamo-path") in (None, "aggregated")
    assert response.json()["choices"][0]["text"] == aggregated.json()["choices"][0]["text"]
    assert response.json()["usage"]["completion_tokens"] == 12


async def test_fallback_path_the_prefill_draws_the_room(graph: dict[str, Any]) -> None:
    response = await complete(graph["url"], "tiny-fallback")
    assert response.status_code == 200, response.text
    assert response.headers["x-dynamo-path"] == "fallback"
    room = int(response.headers["x-dynamo-bootstrap-room"])
    assert [c["bootstrap_room"] for c in records(graph["logs"] / "fb-prefill.jsonl")] == [room]
    assert [c["bootstrap_room"] for c in records(graph["logs"] / "fb-decode.jsonl")] == [room]


async def test_a_decode_request_without_bootstrap_info_asks_a_prefill_worker(graph: dict[str, Any]) -> None:
    client = await graph["runtime"].endpoint("fb.backend.generate").client()
    await client.wait_for_instances(timeout=10)
    before = len(records(graph["logs"] / "fb-prefill.jsonl"))
    request = {
        "token_ids": PROMPT,
        "stop_conditions": {"max_tokens": 5},
        "sampling_options": {"temperature": 0},
    }
    items = await collect(client.round_robin(request))
    assert sum(len(item["token_ids"]) for item in items) == 5 and items[-1]["finish_reason"] == "length"
    prefills = records(graph["logs"] / "fb-prefill.jsonl")[before:]
    assert len(prefills) == 1  # the decode worker asked the prefill worker itself, which drew the room
    assert records(graph["logs"] / "fb-decode.jsonl")[-1]["bootstrap_room"] == prefills[0]["bootstrap_room"]


async def test_cancelling_a_request_aborts_both_legs_in_sglang(graph: dict[str, Any]) -> None:
    prefill_log, decode_log = graph["logs"] / "prefill.jsonl", graph["logs"] / "decode.jsonl"
    before = len(records(prefill_log))
    body = {"model": "tiny-llama", "prompt": list(range(300, 340)), "max_tokens": 400, "stream": True}
    async with httpx.AsyncClient(base_url=graph["url"], timeout=30) as http:
        request = asyncio.ensure_future(http.post("/v1/completions", json=body))
        decoding: list[dict[str, Any]] = []
        for _ in range(500):  # bounded: until both legs have started (the prefill takes 0.6 s)
            started = records(prefill_log)[before:]
            decoding = [
                c
                for c in records(decode_log)
                if started and c["bootstrap_room"] == started[0]["bootstrap_room"]
            ]
            if decoding:
                break
            await asyncio.sleep(0.01)
        assert decoding, "the request did not reach both workers"
        request.cancel()  # the client goes away while the prefill runs and the decode waits for its KV
        with contextlib.suppress(asyncio.CancelledError):
            await request
    (prefill,) = records(prefill_log)[before:]
    (decode,) = decoding
    aborted: dict[str, bool] = {}
    for _ in range(100):
        aborted = {
            leg: sent["rid"] in {c["rid"] for c in records(log, "abort_request")}
            for leg, sent, log in (("prefill", prefill, prefill_log), ("decode", decode, decode_log))
        }
        if all(aborted.values()):
            break
        await asyncio.sleep(0.1)
    assert aborted == {"prefill": True, "decode": True}


async def test_a_failed_prefill_is_a_503_and_says_why(graph: dict[str, Any]) -> None:
    # not enforced: the frontend falls back to the decode worker alone, which SGLang's decode
    # engine cannot do, so the answer names the way out
    response = await complete(graph["url"], "tiny-broken")
    assert response.status_code == 503, response.text
    assert "cannot serve a request alone" in response.json()["error"]["message"]
    enforced = await complete(graph["enforced_url"], "tiny-broken")
    assert enforced.status_code == 503, enforced.text
    assert "disaggregation is enforced" in enforced.json()["error"]["message"]
    assert "KV transfer to the decode engine failed" in enforced.json()["error"]["message"]


async def test_model_cards_carry_the_bootstrap_endpoint_and_sglangs_page_size(graph: dict[str, Any]) -> None:
    from dynamo_nb.llm.card import CARD_PREFIX, ModelCard

    watch = await graph["runtime"].discovery.watch_prefix(CARD_PREFIX)
    cards = [ModelCard.from_json(value) for value in watch.items.values()]
    prefill = {card.name: card for card in cards if "prefill" in card.kinds}
    endpoint = prefill["tiny-llama"].runtime_config.disaggregated_endpoint
    assert endpoint and endpoint["bootstrap_host"] == "127.0.0.1" and endpoint["bootstrap_port"] > 0
    assert prefill["tiny-fallback"].runtime_config.disaggregated_endpoint is None
    assert all(card.kv_cache_block_size == 1 for card in cards if card.name.startswith("tiny-"))


@pytest.mark.processes
def test_help_lists_our_flags_and_sglangs_own() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SGLANG_WORKER), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for flag in (
        "--discovery",
        "--endpoint",
        "--model-path",
        "--disaggregation-mode",
        "--disaggregation-bootstrap-port",
        "--disaggregation-transfer-backend",
        "--fake-engine",
    ):
        assert flag in done.stdout, flag


@pytest.mark.processes
def test_an_unknown_disaggregation_mode_is_refused_with_the_choices() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(SGLANG_WORKER), "--disaggregation-mode", "both"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--disaggregation-mode" in done.stderr and "'prefill'" in done.stderr
