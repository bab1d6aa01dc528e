"""A request's timeline across processes (OpenTelemetry, ``DYN_NB_TRACE=jsonl:DIR``): a
disaggregated request's spans come from the frontend, the prefill worker and the decode worker,
under one trace id, each worker's span a child of the frontend's; and log lines about a request
name it, in the worker that handles it too."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, RuntimeFactory, free_port

from dynamo_nb import bench
from dynamo_nb.runtime import Context
from dynamo_nb.telemetry import RequestIdFilter

pytestmark = pytest.mark.timeout(180)

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the tracing extra (opentelemetry-sdk)")


def spans_in(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()
    ]


async def test_a_disaggregated_request_is_one_trace_across_three_processes(
    services: Any, start_worker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = tmp_path / "traces"
    monkeypatch.setenv("DYN_NB_TRACE", f"jsonl:{traces}")  # the components read it at start
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--speedup-ratio", "50",
           "--endpoint", "tr.backend.generate", "--prefill-endpoint", "tr.prefill.generate"]  # fmt: skip
    prefill = await start_worker(*bus, "--mode", "prefill", script=MOCKER_WORKER)
    decode = await start_worker(*bus, "--mode", "decode", script=MOCKER_WORKER)
    port = free_port()
    frontend = await start_worker(*bus[:4], "--http-port", str(port), script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"model": "tiny-llama", "prompt": list(range(20, 60)), "max_tokens": 4}
        response = await http.post("/v1/completions", json=body, headers={"x-request-id": "trace-me-1"})
        assert response.status_code == 200, response.text
        assert response.headers["x-dynamo-path"] == "fast"
    for process in (frontend, decode, prefill):  # each flushes its spans as it exits
        await process.stop(timeout=10)

    spans = spans_in(traces)
    [root] = [
        s for s in spans if s["name"] == "request" and s["attributes"].get("request_id") == "trace-me-1"
    ]
    trace = [s for s in spans if s["trace_id"] == root["trace_id"]]
    by_id = {s["span_id"]: s for s in trace}
    assert {s["pid"] for s in trace} == {frontend.pid, prefill.pid, decode.pid}
    assert {s["service"] for s in trace} == {"frontend", "mocker_worker"}
    front = {s["name"] for s in trace if s["pid"] == frontend.pid}
    assert {"request", "admission wait", "prefill plan", "route", "stream"} <= front
    assert [e["name"] for e in root["events"]] == ["first token"]
    [prefill_handle] = [s for s in trace if s["pid"] == prefill.pid and s["name"] == "handle"]
    assert by_id[prefill_handle["parent_span_id"]]["name"] == "prefill plan"
    [decode_handle] = [s for s in trace if s["pid"] == decode.pid and s["name"] == "handle"]
    assert by_id[decode_handle["parent_span_id"]]["name"] == "request"
    assert decode_handle["attributes"]["request_id"] == "trace-me-1"
    [handoff] = [s for s in trace if s["name"] == "kv handoff"]
    assert handoff["pid"] == decode.pid and handoff["parent_span_id"] == decode_handle["span_id"]
    for span in trace:  # every span of the trace closes inside its parent
        parent = by_id.get(span["parent_span_id"])
        if parent is not None and parent["pid"] == span["pid"]:
            assert parent["start_ns"] <= span["start_ns"] <= span["end_ns"] <= parent["end_ns"], span["name"]


async def test_a_workers_log_lines_about_a_request_name_it(make_runtime: RuntimeFactory) -> None:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    keep.addFilter(RequestIdFilter())
    logger = logging.getLogger("test.worker")
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)

    async def chatty(request: Any) -> Any:
        logger.info("working on %s", request["what"])
        yield {"ok": True}

    try:
        runtime = await make_runtime("memory-tcp")
        endpoint = runtime.endpoint("logs.chatty.generate")
        await endpoint.serve(chatty)
        client = await endpoint.client()
        await client.wait_for_instances(timeout=5)
        assert [item async for item in client.round_robin({"what": "x"}, context=Context("req-42"))] == [
            {"ok": True}
        ]
        logger.info("no request here")
    finally:
        logger.removeHandler(keep)
    assert seen == ["[request req-42] working on x", "no request here"]
