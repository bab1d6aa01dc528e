"""Disaggregated serving over two stock vLLM servers (vLLM's CPU build): one started with its
NixlConnector as KV producer, one as consumer, an upstream worker in front of each (``--mode
prefill`` / ``--mode decode``) and the kit's frontend as vLLM's disaggregated proxy: the prefill
server is asked with ``kv_transfer_params {"do_remote_decode": true}`` and one token, its answer's
``kv_transfer_params`` go to the decode server, whose connector pulls the prompt's KV (NIXL, a
host-memory buffer without CUDA)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, free_port

from dynamo_nb import launch
from dynamo_nb.launch import launch_server, launch_upstream
from dynamo_nb.models import tiny_model_path

pytestmark = [pytest.mark.vllm, pytest.mark.processes, pytest.mark.timeout(600)]

MODEL = "tiny-llama"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
VLLM_FLAGS = ["--model", str(tiny_model_path()), "--served-model-name", MODEL, "--max-model-len", "1024",
              "--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager", "--enable-prompt-tokens-details"]  # fmt: skip


async def start_vllm(role: str, logs: Any) -> Any:
    """A vLLM server whose NixlConnector is ``role`` (kv_producer or kv_consumer)."""
    port, side_channel = free_port(bound_later=True), free_port(bound_later=True)  # bound ~30 s on
    config = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
    env = {
        **ONE_THREAD,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel),
    }
    return await launch_server(sys.executable, "-m", "vllm.entrypoints.openai.api_server", *VLLM_FLAGS,
                               "--port", port, "--kv-transfer-config", json.dumps(config),
                               url=f"http://127.0.0.1:{port}", name=role, env=env, log_dir=logs,
                               show_logs=False, timeout=400)  # fmt: skip


@pytest.fixture(scope="module")
async def pair(services: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("upstream-disagg")
    prefill, decode = await start_vllm("kv_producer", logs), await start_vllm("kv_consumer", logs)
    common = ["--discovery", services.etcd_url, "--log-level", "WARNING"]
    workers = [
        await launch_upstream(prefill, *common, "--mode", "prefill", name="upstream-prefill", log_dir=logs, show_logs=False),
        await launch_upstream(decode, *common, "--mode", "decode", name="upstream-decode", log_dir=logs, show_logs=False),
    ]  # fmt: skip
    port = free_port()
    frontend = await launch(FRONTEND, "--discovery", services.etcd_url, "--http-port", port, "--enforce-disagg",
                            cwd=ROOT, log_dir=logs, show_logs=False, timeout=60)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    from dynamo_nb import bench

    await bench.wait_for_model(url, MODEL, timeout=60)
    yield {"prefill": prefill, "decode": decode, "url": url}
    for process in [frontend, *workers, decode, prefill]:
        await process.stop(timeout=30)


async def transfers(server: Any) -> float:
    """KV transfers vLLM's NixlConnector made (its /metrics)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{server.url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:nixl_xfer_time_seconds_count")
    )


async def test_the_kit_disaggregates_two_stock_vllm_servers_and_the_kv_moves(pair: dict[str, Any]) -> None:
    """Through the kit: the fallback path (the prefill's kv_transfer_params awaited), the prefill
    on one server and the decode on the other, vLLM's NIXL moved the prompt's KV once per
    request, and the text is what the decode server makes of the prompt by itself."""
    prompt = "the harbour keeps its ships in rows, " * 12
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    before = await transfers(pair["decode"])
    async with httpx.AsyncClient(timeout=120) as http:
        through = await http.post(f"{pair['url']}/v1/completions", json=body)
        assert through.status_code == 200, through.text
        assert through.headers["x-dynamo-path"] == "fallback", dict(through.headers)
        assert through.headers["x-dynamo-prefill-worker"] != through.headers["x-dynamo-decode-worker"]
        assert await transfers(pair["decode"]) == before + 1
        alone = await http.post(f"{pair['decode'].url}/v1/completions", json={**body, "prompt": prompt})
    assert through.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
    assert through.json()["usage"]["completion_tokens"] == 12
