"""Real SGLang on a CUDA GPU: an aggregated worker, then a prefill + decode pair behind the frontend.

Skipped (with the reason) without CUDA or without SGLang and its dependencies
(``pip install -e ".[sglang]"`` on a GPU machine). The model is the built-in tiny Llama unless
``DYN_NB_SGLANG_MODEL`` names a local folder. Both engines share GPU 0, each with a small
static memory fraction; the KV moves with NIXL (``--disaggregation-transfer-backend nixl``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, free_port

from dynamo_nb import launch
from dynamo_nb.engines.sglang import sglang_available

pytestmark = [pytest.mark.gpu, pytest.mark.sglang, pytest.mark.timeout(600)]

SGLANG_WORKER = ROOT / "components" / "sglang_worker.py"


def _skip_reason() -> str | None:
    """Why it cannot run on this GPU host (the ``gpu`` and ``sglang`` markers cover the rest)."""
    if not sglang_available():
        return 'needs SGLang with its dependencies: pip install -e ".[sglang]"'
    return None


async def test_sglang_disaggregated_greedy_output_equals_aggregated(services: Any, tmp_path: Any) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    model = os.environ.get("DYN_NB_SGLANG_MODEL")
    common = [
        "--discovery",
        services.etcd_url,
        "--nats-url",
        services.nats_url,
        "--mem-fraction-static",
        "0.25",
    ]
    common += ["--model-path", model] if model else []
    pair = ["--disaggregation-transfer-backend", "nixl"]

    def worker(name: str, *flags: str) -> Any:
        return launch(SGLANG_WORKER, *common, *flags, cwd=ROOT, log_dir=tmp_path, timeout=400, name=name)

    aggregated = await worker("agg", "--endpoint", "agg.backend.generate", "--model-name", "agg")
    prefill, decode = await asyncio.gather(
        worker(
            "prefill",
            *pair,
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(free_port()),
        ),
        worker("decode", *pair, "--disaggregation-mode", "decode"),
    )
    port = free_port()
    frontend = await launch(
        FRONTEND, "--discovery", services.etcd_url, "--nats-url", services.nats_url, "--http-port", str(port),
        cwd=ROOT, log_dir=tmp_path, timeout=60,
    )  # fmt: skip
    try:
        body = {"prompt": list(range(10, 110)), "max_tokens": 16, "temperature": 0}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            for _ in range(300):
                names = {m["id"] for m in (await http.get("/v1/models")).json()["data"]}
                if len(names) >= 2:
                    break
                await asyncio.sleep(0.2)
            disaggregated = await http.post(
                "/v1/completions", json={**body, "model": sorted(names - {"agg"})[0]}
            )
            alone = await http.post("/v1/completions", json={**body, "model": "agg"})
        assert disaggregated.status_code == 200, disaggregated.text
        assert disaggregated.headers["x-dynamo-path"] == "fast"
        assert disaggregated.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
    finally:
        await asyncio.gather(*(p.stop(timeout=30) for p in (frontend, prefill, decode, aggregated)))
