"""Disaggregated prefill/decode, worker side: rooms, the KV wire format, the bootstrap server,
the hf engine's prefill and decode roles, and prefill + decode worker processes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, HF_WORKER, RuntimeFactory, collect, free_port, req

from dynamo_nb import DisaggregationError, DistributedRuntime, DynamoNBError, bench
from dynamo_nb.disagg import (
    MAX_ROOM,
    BootstrapInfo,
    BootstrapServer,
    KVLayout,
    check_header,
    draw_room,
    draw_token,
    fetch_kv,
    pack_kv,
    unpack_kv,
)
from dynamo_nb.disagg.decode import DecodeHandler
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import LLMEngineOutput, ModelTokenizer, PreprocessedRequest, ReadinessGate, serve_llm
from dynamo_nb.router import KvRouter, RoundRobinRouter
from dynamo_nb.router.prefill_planner import PrefillPlanner

PROMPT = list(range(5, 45))
GREEDY = {"token_ids": PROMPT, "stop_conditions": {"max_tokens": 12}, "sampling_options": {"temperature": 0}}


def tokens(items: list[Any]) -> list[int]:
    return [t for item in items for t in item["token_ids"]]


def test_rooms_are_unique_and_in_range() -> None:
    rooms = [draw_room() for _ in range(10_000)]
    assert len(set(rooms)) == 10_000 and all(0 <= r <= MAX_ROOM for r in rooms)
    assert max(rooms) > 2**62  # they use the whole 63-bit range


@pytest.mark.parametrize(
    "params, says",
    [
        (None, "must be an object"),
        ({"bootstrap_host": "h"}, "lacks bootstrap_port, bootstrap_room"),
        (
            {"bootstrap_host": "h", "bootstrap_port": "7", "bootstrap_room": 1},
            "bootstrap_port must be a port",
        ),
        ({"bootstrap_host": "h", "bootstrap_port": 7, "bootstrap_room": -1}, "0..2**63-1"),
        ({"bootstrap_host": "h", "bootstrap_port": 7, "bootstrap_room": 2**63}, "0..2**63-1"),
        ({"bootstrap_host": "", "bootstrap_port": 7, "bootstrap_room": 1}, "bootstrap_host must be"),
    ],
)
def test_malformed_disaggregated_params_name_what_is_wrong(params: Any, says: str) -> None:
    with pytest.raises(DisaggregationError, match="disaggregated_params") as caught:
        BootstrapInfo.parse(params)
    assert says in str(caught.value)


def test_the_handoff_travels_typed_and_comes_back_equal() -> None:
    """Bootstrap info and a prefill result are typed on both sides of the wire: written as
    dicts (msgpack), read back into the same objects."""
    import msgpack

    from dynamo_nb.llm import PrefillResult

    info = BootstrapInfo("127.0.0.1", 7000, draw_room(), draw_token())
    fast = PreprocessedRequest(token_ids=[1, 2], bootstrap_info=info)
    fallback = PreprocessedRequest(token_ids=[1, 2], prefill_result=PrefillResult(bootstrap=info))
    vllm = PreprocessedRequest(token_ids=[1], prefill_result=PrefillResult(kv_transfer_params={"ids": [3]}))
    for request in (fast, fallback, vllm):
        wire = msgpack.unpackb(msgpack.packb(request.to_dict()))
        assert PreprocessedRequest.from_dict(wire) == request
    assert fast.to_dict()["bootstrap_info"]["bootstrap_token"] == info.token
    assert vllm.to_dict()["prefill_result"] == {"disaggregated_params": {"kv_transfer_params": {"ids": [3]}}}


async def test_bootstrap_server_parks_waits_fails_and_expires() -> None:
    server = await BootstrapServer.start(ttl=60)
    try:
        where = (server.host, server.port)
        assert server.endpoint == {"bootstrap_host": "127.0.0.1", "bootstrap_port": server.port}
        header = {"payload_bytes": 3, "first_token": 7}
        # parked first, fetched after
        server.park(1, header, b"abc")
        assert server.parked == 1
        assert await fetch_kv(BootstrapInfo(*where, 1), timeout=1) == (header, b"abc")
        assert server.parked == 0 and server.served_total == 1
        # fetched first: the decode waits for the prefill
        waiting = asyncio.ensure_future(fetch_kv(BootstrapInfo(*where, 2), timeout=5))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        server.park(2, header, b"xyz")
        assert (await waiting)[1] == b"xyz"
        # a room is handed out once
        with pytest.raises(DisaggregationError, match=re.escape("no KV cache for room 2 within 0.2 s")):
            await fetch_kv(BootstrapInfo(*where, 2), timeout=0.2)
        # a failed prefill reaches its decode as an error
        server.fail(3, "RuntimeError: out of memory")
        with pytest.raises(
            DisaggregationError, match="room 3: the prefill failed: RuntimeError: out of memory"
        ):
            await fetch_kv(BootstrapInfo(*where, 3), timeout=1)
        with pytest.raises(DisaggregationError, match="already in use"):
            server.park(4, header, b"abc") or server.park(4, header, b"abc")
    finally:
        await server.stop()
    with pytest.raises(DisaggregationError, match="cannot reach the bootstrap server"):
        await fetch_kv(BootstrapInfo("127.0.0.1", free_port(), 1), timeout=1)


async def test_a_decode_waits_for_a_slow_prefill_and_not_for_a_frozen_one() -> None:
    """A prefill that takes longer than the decode's silence bound keeps it waiting (its server says
    so every KEEPALIVE_S); a server that says nothing at all — a frozen prefill worker, whose
    kernel still accepts the connection — ends the decode's wait at the bound, not at its timeout."""
    import socket

    from dynamo_nb.disagg.bootstrap import KEEPALIVE_S

    silence = 2 * KEEPALIVE_S
    server = await BootstrapServer.start(ttl=60)
    try:
        header = {"payload_bytes": 1, "first_token": 7}
        info = BootstrapInfo(server.host, server.port, 9)
        waiting = asyncio.ensure_future(fetch_kv(info, timeout=30, silence=silence))
        await asyncio.sleep(2.5 * silence)
        assert not waiting.done()
        server.park(9, header, b"k")
        assert await waiting == (header, b"k")
    finally:
        await server.stop()
    frozen = socket.create_server(("127.0.0.1", 0), backlog=8)  # listens, never accepts nor answers
    try:
        info = BootstrapInfo("127.0.0.1", frozen.getsockname()[1], 9)
        with pytest.raises(DisaggregationError, match=rf"sent nothing for {silence:g} s .* seems to hang"):
            await fetch_kv(info, timeout=30, silence=silence)
    finally:
        frozen.close()


async def test_parked_kv_expires_and_a_waiting_decode_learns_why() -> None:
    server = await BootstrapServer.start(ttl=0.2)  # its sweeper looks every ttl/4
    try:
        server.park(10, {"payload_bytes": 1}, b"x")  # a decode that never comes
        waiting = fetch_kv(
            BootstrapInfo(server.host, server.port, 11), timeout=10
        )  # a prefill that never comes
        with pytest.raises(DisaggregationError, match=re.escape("room 11: expired after 0.2 s")):
            await waiting
        for _ in range(40):
            if server.expired_total == 2:
                break
            await asyncio.sleep(0.05)
        assert server.expired_total == 2 and server.parked == 0 and not server._rooms
        with pytest.raises(DisaggregationError, match="no KV cache for room 10"):
            await fetch_kv(BootstrapInfo(server.host, server.port, 10), timeout=0.1)
    finally:
        await server.stop()


def test_kv_wire_round_trip_and_checks(hf_engine: Any) -> None:
    import torch

    layout = KVLayout.of(hf_engine.model.config)
    layers = [
        (
            torch.randn(1, layout.kv_heads, 5, layout.head_dim),
            torch.randn(1, layout.kv_heads, 5, layout.head_dim),
        )
        for _ in range(layout.layers)
    ]
    header, payload = pack_kv(layers, first_token=42)
    assert json.loads(json.dumps(header)) == header  # plain JSON: nothing pickled
    assert (
        header["prompt_tokens"] == 5
        and header["first_token"] == 42
        and len(payload) == header["payload_bytes"]
    )
    back = unpack_kv(header, payload, expect=layout)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(layers, back, strict=True))
    half = [(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in layers]
    h16, p16 = pack_kv(half, first_token=1)
    assert h16["dtype"] == "bfloat16" and torch.equal(unpack_kv(h16, p16)[0][0], half[0][0])
    with pytest.raises(DisaggregationError, match="payload is 10 bytes"):
        check_header(header, 10)
    with pytest.raises(DisaggregationError, match=re.escape("not a dynamo_nb.kv.v1")):
        check_header({**header, "format": "pickle"}, len(payload))
    with pytest.raises(DisaggregationError, match="same model"):
        check_header(header, len(payload), KVLayout(layout.layers + 1, layout.kv_heads, layout.head_dim))
    with pytest.raises(DisaggregationError, match="dtype"):
        check_header({**header, "dtype": "int64"}, len(payload))


async def test_engine_roles_give_the_aggregated_tokens_on_both_paths(hf_engine: Any) -> None:
    await hf_engine.start_bootstrap()
    aggregated = tokens(await collect(hf_engine.generate(req(GREEDY))))

    # fast path: the room is drawn up front and the decode is sent before the prefill runs
    info = {**hf_engine.bootstrap.endpoint, "bootstrap_room": draw_room(), "bootstrap_token": draw_token()}
    events: list[str] = []

    async def decode() -> list[Any]:
        events.append("decode sent")
        items = await collect(hf_engine.decode(req({**GREEDY, "bootstrap_info": info})))
        events.append("decode done")
        return items

    decoding = asyncio.ensure_future(decode())
    await asyncio.sleep(0)  # the decode is on its way (waiting for the KV) before the prefill starts
    prefill = await collect(hf_engine.prefill(req({**GREEDY, "bootstrap_info": info})))
    events.append("prefill done")
    fast = await decoding
    assert events == ["decode sent", "prefill done", "decode done"]
    assert prefill[0] == {"token_ids": [], "disaggregated_params": info}
    assert prefill[1]["token_ids"] == aggregated[:1] and prefill[1]["finish_reason"] == "length"
    assert tokens(fast) == aggregated and fast[-1]["completion_usage"]["completion_tokens"] == 12

    # fallback path: the prefill draws its room, the decode gets its disaggregated_params
    prefill = await collect(hf_engine.prefill(req(GREEDY)))
    params = prefill[0]["disaggregated_params"]
    assert 0 <= params["bootstrap_room"] <= MAX_ROOM and params["bootstrap_port"] == info["bootstrap_port"]
    fallback = await collect(
        hf_engine.decode(req({**GREEDY, "prefill_result": {"disaggregated_params": params}}))
    )
    assert tokens(fallback) == aggregated
    assert hf_engine.bootstrap.parked == 0 and hf_engine.active == 0


async def test_decode_refuses_what_it_cannot_use(hf_engine: Any) -> None:
    await hf_engine.start_bootstrap()
    with pytest.raises(DisaggregationError, match=r"needs bootstrap_info .* or prefill_result"):
        await collect(hf_engine.decode(req(GREEDY)))
    with pytest.raises(
        DisaggregationError, match=re.escape("prefill_result.disaggregated_params lacks bootstrap_room")
    ):
        params = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1}
        await collect(hf_engine.decode(req({**GREEDY, "prefill_result": {"disaggregated_params": params}})))
    prefill = await collect(hf_engine.prefill(req(GREEDY)))
    shorter = {
        **GREEDY,
        "token_ids": PROMPT[:-3],
        "prefill_result": {"disaggregated_params": prefill[0]["disaggregated_params"]},
    }
    with pytest.raises(
        DisaggregationError, match="holds the KV of 40 prompt tokens, but this request has 37"
    ):
        await collect(hf_engine.decode(req(shorter)))
    vllms = {"kv_transfer_params": {"remote_block_ids": [0]}}  # another engine's handoff
    with pytest.raises(DisaggregationError, match="the prefill sent an engine's own kv_transfer_params"):
        await collect(hf_engine.decode(req({**GREEDY, "prefill_result": {"disaggregated_params": vllms}})))
    # the handoff is typed: a malformed one is refused where the request enters the process
    bad_room = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": "x"}
    with pytest.raises(DisaggregationError, match=r"bootstrap_info\.bootstrap_room must be an integer"):
        req({**GREEDY, "bootstrap_info": bad_room})
    with pytest.raises(DisaggregationError, match=r"bootstrap_info lacks bootstrap_host, bootstrap_port"):
        req({**GREEDY, "bootstrap_info": {"bootstrap_room": 5}})


# slow (20 s): CI's opt-in step runs it; the README suite serves worker processes disaggregated in
# notebook 05, the mutual-TLS test and the disagg_hf graph (it keeps under 15 minutes)
@pytest.mark.long
async def test_prefill_and_decode_worker_processes_behind_a_frontend(
    services: Any, start_worker: Any, make_runtime: RuntimeFactory, hf_engine: Any, tiny_path: Path
) -> None:
    etcd = ["--discovery", services.etcd_url]
    endpoints = ["--endpoint", "dg.backend.generate", "--prefill-endpoint", "dg.prefill.generate"]
    short_lease = ["--lease-ttl", "2"]  # they are killed below: their keys leave the shared etcd soon
    prefills = [
        await start_worker(*etcd, *endpoints, *short_lease, "--mode", "prefill", script=HF_WORKER),
        await start_worker(
            *etcd, *endpoints, *short_lease, "--mode", "prefill", "--no-bootstrap-endpoint", script=HF_WORKER
        ),
    ]
    decode = await start_worker(*etcd, *endpoints, "--mode", "decode", script=HF_WORKER)
    assert prefills[0].ready_line.startswith("READY dg.prefill.generate")
    assert decode.ready_line.startswith("READY dg.backend.generate")
    rt = await make_runtime("etcd-tcp")
    cards = (await rt.discovery.watch_prefix("v1/mdc/dg/")).items  # READY comes after the card
    by_worker = {int(key.rsplit("/", 1)[1], 16): json.loads(value) for key, value in cards.items()}
    fast_id, fallback_id = prefills[0].instance_id, prefills[1].instance_id
    assert (
        by_worker[fast_id]["kinds"] == ["prefill"] and by_worker[decode.instance_id]["kinds"][-1] == "decode"
    )
    endpoint = by_worker[fast_id]["runtime_config"]["disaggregated_endpoint"]
    assert endpoint["bootstrap_host"] == "127.0.0.1" and endpoint["bootstrap_port"] > 0
    assert by_worker[fallback_id]["runtime_config"]["disaggregated_endpoint"] is None

    tokenizer = ModelTokenizer.load(tiny_path)
    prompt = "Once upon a time"
    ids = tokenizer.encode(prompt, add_special_tokens=True)
    request = {
        "token_ids": ids,
        "stop_conditions": {"max_tokens": 16},
        "sampling_options": {"temperature": 0},
    }
    aggregated = tokens(await collect(hf_engine.generate(req(request))))
    expected = tokenizer.decode(aggregated)

    # a decode request with no bootstrap info: the decode worker asks a prefill worker itself
    decode_client = await rt.endpoint("dg.backend.generate").client()
    assert tokens(await collect(decode_client.round_robin(request))) == aggregated

    port, strict_port = free_port(), free_port()
    await start_worker(*etcd, "--http-port", str(port), script=FRONTEND)
    await start_worker(*etcd, "--http-port", str(strict_port), "--enforce-disagg", script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 16, "temperature": 0}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:

        async def both_prefill_workers_known() -> None:  # else both requests may take one path
            while True:
                health = (await http.get("/health")).json()
                known = {int(i["instance_id"], 16) for i in health.get("prefill_instances", [])}
                if {fast_id, fallback_id} <= known:
                    return
                await asyncio.sleep(0.1)

        await asyncio.wait_for(both_prefill_workers_known(), 60)
        seen = {}
        for _ in range(2):  # round robin over the two prefill workers: one of each path
            response = await http.post("/v1/completions", json=body)
            assert response.json()["choices"][0]["text"] == expected
            seen[response.headers["x-dynamo-path"]] = response.headers
        assert set(seen) == {"fast", "fallback"}
        assert seen["fast"]["x-dynamo-prefill-worker"] == f"{fast_id:x}"
        assert seen["fallback"]["x-dynamo-prefill-worker"] == f"{fallback_id:x}"
        assert all(h["x-dynamo-decode-worker"] == f"{decode.instance_id:x}" for h in seen.values())
        assert all(0 <= int(h["x-dynamo-bootstrap-room"]) <= MAX_ROOM for h in seen.values())
        assert all(float(h["x-dynamo-handoff-ms"]) >= 0 for h in seen.values())  # the planning wait
        streamed = await http.post("/v1/completions", json={**body, "stream": True})
        assert (
            "".join(
                json.loads(line[6:])["choices"][0]["text"]
                for line in streamed.text.splitlines()
                if line.startswith("data: {") and json.loads(line[6:])["choices"]
            )
            == expected
        )

        # the prefill workers die: aggregated with a warning, or a 503 when enforced — never a hang
        for prefill in prefills:
            prefill.send_signal(signal.SIGKILL)
            await prefill.wait(timeout=10)
        for _ in range(2):
            asked = {**body, "nvext": {"extra_fields": ["routing"]}}  # the decision record says why
            response = await http.post("/v1/completions", json=asked)
            assert response.status_code == 200 and response.json()["choices"][0]["text"] == expected
            assert response.headers["x-dynamo-path"] == "aggregated"
            routing = response.json()["nvext"]["routing"]
            assert routing["prefill"] is None and routing["aggregated_because"], routing
        strict = await http.post(f"http://127.0.0.1:{strict_port}/v1/completions", json=body)
        assert strict.status_code == 503 and "disaggregation is enforced" in strict.json()["error"]["message"]
        metrics = (await http.get("/metrics")).text
    counts = {
        line.split('path="')[1].split('"')[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("dynamo_frontend_disagg_requests_total{")
    }
    assert counts["fast"] + counts["fallback"] == 3 and counts["aggregated"] == 2
    errors = [
        line for line in metrics.splitlines() if line.startswith("dynamo_frontend_prefill_errors_total{")
    ]
    assert errors and float(errors[0].split()[-1]) >= 2  # each aggregated request followed a failure
    # the killed prefill workers leave discovery (a later test's frontend must not route to them)
    prefill_client = await rt.endpoint("dg.prefill.generate").client()
    for _ in range(200):
        if not prefill_client.instance_ids():
            break
        await asyncio.sleep(0.05)
    assert prefill_client.instance_ids() == []


async def test_a_cancelled_decode_frees_its_sequence(hf_engine: Any) -> None:
    await hf_engine.start_bootstrap()
    prefill = await collect(hf_engine.prefill(req(GREEDY)))
    long = {**GREEDY, "stop_conditions": {"max_tokens": 300, "ignore_eos": True}}
    stream = hf_engine.decode(
        req({**long, "prefill_result": {"disaggregated_params": prefill[0]["disaggregated_params"]}})
    )
    await stream.__anext__()  # the prefill's first token
    await stream.__anext__()  # one decoded here
    assert hf_engine.active == 1
    await stream.aclose()
    assert hf_engine.active == 0


async def test_a_prefill_card_that_comes_before_its_instance_is_waited_for(
    hf_engine: Any, tiny_path: Path
) -> None:
    """Discovery may deliver a prefill worker's card before its instance: the request waits for
    the instance and is disaggregated, where it used to be served aggregated; an instance that
    never comes is given up on (aggregated, with the reason)."""
    await hf_engine.start_bootstrap()
    runtime = await DistributedRuntime.create()
    try:
        client = await runtime.endpoint("early.prefill.generate").client()
        never = PrefillPlanner("early.prefill.generate", RoundRobinRouter(client), prefill_timeout=0.3)
        never.add_worker("early/prefill/card-a", 1, None)
        given_up = await asyncio.wait_for(never.plan(req(GREEDY)), 5)
        assert given_up.path == "aggregated" and "prefill failed" in given_up.reason

        planner = PrefillPlanner("early.prefill.generate", RoundRobinRouter(client))
        planner.add_worker("early/prefill/card-b", 2, None)  # its card, before any instance
        planning = asyncio.create_task(planner.plan(req(GREEDY)))
        await asyncio.sleep(0.3)
        assert not planning.done()  # waiting for the instance
        await serve_llm(
            runtime.endpoint("early.prefill.generate"),
            hf_engine.prefill,
            tiny_path,
            model_name="early",
            kind="prefill",
        )
        plan = await asyncio.wait_for(planning, 10)
        assert plan.path == "fallback" and plan.prefill_worker in client.instance_ids()
        plan.cancel()
    finally:
        await runtime.shutdown()


async def test_fast_path_sends_decode_before_its_prefill_finishes(hf_engine: Any, tiny_path: Path) -> None:
    """Shown by event order: on the fast path the prefill handler is held until the decode has
    arrived; a router that waited for the prefill before sending the decode would never finish."""
    await hf_engine.start_bootstrap()
    events: list[str] = []
    decode_arrived = asyncio.Event()

    async def prefill(request: PreprocessedRequest, context: Any) -> Any:
        events.append("prefill received")
        await asyncio.wait_for(decode_arrived.wait(), 10)
        async for output in hf_engine.prefill(request, context):
            yield output
        events.append("prefill finished")

    async def decode(request: PreprocessedRequest, context: Any) -> Any:
        events.append("decode received")
        decode_arrived.set()
        async for output in hf_engine.decode(request, context):
            yield output

    runtime = await DistributedRuntime.create()
    try:
        endpoint = {"disaggregated_endpoint": hf_engine.bootstrap.endpoint}
        await serve_llm(
            runtime.endpoint("ev.prefill.generate"),
            prefill,
            tiny_path,
            model_name="ev",
            kind="prefill",
            runtime_config=endpoint,
        )
        await serve_llm(
            runtime.endpoint("ev.backend.generate"),
            decode,
            tiny_path,
            model_name="ev",
            kind=["completions", "decode"],
        )
        frontend = await Frontend.start(runtime, port=0)
        await frontend.wait_for_model("ev")
        for _ in range(100):
            if frontend.models.prefill_planner("ev") is not None:
                break
            await asyncio.sleep(0.02)
        request = {
            "token_ids": PROMPT,
            "stop_conditions": {"max_tokens": 8},
            "sampling_options": {"temperature": 0},
        }
        expected = ModelTokenizer.load(tiny_path).decode(
            tokens(await collect(hf_engine.generate(req(request))))
        )
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            body = {"model": "ev", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
            response = await http.post("/v1/completions", json=body)
            health = (await http.get("/health")).json()
        assert response.status_code == 200 and response.headers["x-dynamo-path"] == "fast"
        assert [(i["model"], i["endpoint"]) for i in health["prefill_instances"]] == [
            ("ev", "ev.prefill.generate")
        ]
        assert response.json()["choices"][0]["text"] == expected
        assert events.index("decode received") < events.index("prefill finished")
        await frontend.stop()
    finally:
        await runtime.shutdown()


async def test_malformed_disaggregated_params_from_a_prefill_worker(hf_engine: Any, tiny_path: Path) -> None:
    async def bad_prefill(request: PreprocessedRequest, context: Any) -> Any:
        yield LLMEngineOutput([], disaggregated_params={"bootstrap_host": "127.0.0.1"})

    runtime = await DistributedRuntime.create()
    try:
        prefill_client = await runtime.endpoint("bad.prefill.generate").client()
        await serve_llm(
            runtime.endpoint("bad.prefill.generate"), bad_prefill, tiny_path, model_name="bad", kind="prefill"
        )
        handler = DecodeHandler(hf_engine, prefill_client)
        await serve_llm(
            runtime.endpoint("bad.backend.generate"),
            handler.generate,
            tiny_path,
            model_name="bad",
            kind=["completions", "decode"],
        )
        lenient = await Frontend.start(runtime, port=0)
        strict = await Frontend.start(runtime, port=0, enforce_disagg=True)
        for frontend in (lenient, strict):
            await frontend.wait_for_model("bad")
            for _ in range(100):
                if frontend.models.prefill_planner("bad") is not None:
                    break
                await asyncio.sleep(0.02)
        body = {"model": "bad", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        async with httpx.AsyncClient(timeout=30) as http:
            served = await http.post(lenient.url + "/v1/completions", json=body)
            refused = await http.post(strict.url + "/v1/completions", json=body)
        assert served.status_code == 200 and served.headers["x-dynamo-path"] == "aggregated"
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert (
            "disaggregated_params lacks bootstrap_port, bootstrap_room" in message and "enforced" in message
        )
        await lenient.stop()
        await strict.stop()
    finally:
        await runtime.shutdown()


async def test_a_request_before_registration_completes_waits_for_it(tiny_path: Path) -> None:
    """serve_llm serves first and publishes the card after; a request in between is held, not lost."""
    runtime = await DistributedRuntime.create()
    publish = runtime.discovery.put
    card_written = asyncio.Event()
    let_card_through = asyncio.Event()

    async def slow_put(key: str, value: bytes) -> None:  # the real put, held until the test says so
        if key.startswith("v1/mdc/"):
            card_written.set()
            await let_card_through.wait()
        await publish(key, value)

    runtime.discovery.put = slow_put  # type: ignore[method-assign]
    try:
        serving = asyncio.ensure_future(
            serve_llm(
                runtime.endpoint("gate.backend.generate"), EchoEngine().generate, tiny_path, model_name="g"
            )
        )
        await asyncio.wait_for(card_written.wait(), 10)  # the endpoint serves; its card is on its way
        client = await runtime.endpoint("gate.backend.generate").client()
        await client.wait_for_instances(timeout=5)
        request = {"token_ids": [5, 6, 7], "stop_conditions": {"max_tokens": 3}}
        answer = asyncio.ensure_future(collect(client.round_robin(request)))
        await asyncio.sleep(0.2)
        assert not answer.done()  # held at the gate
        let_card_through.set()
        _server, card = await serving
        assert tokens(await asyncio.wait_for(answer, 10)) == [5, 6, 7]
        assert card.name == "g"
    finally:
        await runtime.shutdown()


async def test_the_gate_gives_up_with_a_clear_error() -> None:
    async def handler(request: Any) -> Any:
        yield request

    gate = ReadinessGate(handler, timeout=0.1)
    with pytest.raises(DynamoNBError, match=r"registration did not complete within 0\.1 s"):
        await collect(gate.handle({"x": 1}, None))
    assert gate.held_total == 1
    gate.open()
    assert await collect(gate.handle({"x": 2}, None)) == [{"x": 2}]


async def test_a_decode_waiting_on_a_prefill_that_dies_gets_an_error_not_a_hang() -> None:
    server = await BootstrapServer.start()
    waiting = asyncio.ensure_future(fetch_kv(BootstrapInfo(server.host, server.port, 77), timeout=30))
    for _ in range(200):  # bounded: until the decode's fetch waits in room 77
        if server.rooms == 1:
            break
        await asyncio.sleep(0.01)
    assert server.rooms == 1
    await server.stop()  # what a SIGKILLed prefill worker looks like from the decode side
    with pytest.raises(DisaggregationError, match="closed the connection for room 77"):
        await asyncio.wait_for(waiting, 5)


async def test_kv_mode_sends_a_repeated_prefix_to_the_same_prefill_worker(
    hf_engine: Any, tiny_path: Path
) -> None:
    """With ``--router-mode kv`` the prefill planner asks the KV router: a prompt that went to
    one prefill worker counts as cached there, so its repeats follow it; a new prompt goes to
    the other (emptier) worker. Its load is released when the prefill ends."""
    await hf_engine.start_bootstrap()
    runtimes = [await DistributedRuntime.create() for _ in range(2)]
    try:
        for runtime in runtimes:  # two prefill instances of the same engine
            await serve_llm(
                runtime.endpoint("kvp.prefill.generate"),
                hf_engine.prefill,
                tiny_path,
                model_name="kvp",
                kind="prefill",
                runtime_config={"disaggregated_endpoint": hf_engine.bootstrap.endpoint},
            )
        await serve_llm(
            runtimes[0].endpoint("kvp.backend.generate"),
            hf_engine.decode,
            tiny_path,
            model_name="kvp",
            kind=["completions", "decode"],
        )
        frontend = await Frontend.start(runtimes[0], port=0, router_mode="kv")
        await frontend.wait_for_model("kvp")
        for _ in range(100):
            router = frontend.models.prefill_planner("kvp")
            if router is not None and len(router.router.client.instance_ids()) == 2:
                break
            await asyncio.sleep(0.02)
        assert router is not None and isinstance(router.router, KvRouter)

        async def prefill_worker(http: httpx.AsyncClient, prompt: list[int]) -> str:
            body = {"model": "kvp", "prompt": prompt, "max_tokens": 2}
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200 and response.headers["x-dynamo-path"] == "fast"
            return response.headers["x-dynamo-prefill-worker"]

        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            first = await prefill_worker(http, [*range(5, 69), 1])  # 4 full blocks of 16
            repeats = [await prefill_worker(http, [*range(5, 69), 2 + i]) for i in range(3)]
            other = await prefill_worker(http, list(range(100, 164)))
        assert repeats == [first] * 3
        assert other != first and {first, other} == {f"{r.connection_id:x}" for r in runtimes}
        for _ in range(100):  # the drained prefill streams release their load
            if all(not load.requests for load in router.router.loads.values()):
                break
            await asyncio.sleep(0.02)
        assert all(not load.requests for load in router.router.loads.values())
        await frontend.stop()
    finally:
        for runtime in runtimes:
            await runtime.shutdown()


async def test_a_prefill_drain_cancelled_before_it_starts_still_closes_its_stream() -> None:
    """The prefill planner's load on a prefill worker is released when its stream closes: a plan
    cancelled at once (its decode found no worker) must close the stream all the same."""
    from dynamo_nb.disagg import handoff

    class Stream:
        closed = 0

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            raise StopAsyncIteration

        async def aclose(self) -> None:
            Stream.closed += 1

    task = handoff.drain(Stream(), what="a prefill")
    task.cancel()  # before its first step
    for _ in range(3):
        await asyncio.sleep(0)
    assert task.cancelled() and Stream.closed == 1
    ran = handoff.drain(Stream(), what="a prefill")
    await ran
    assert Stream.closed == 2  # closed once by the drain itself, not twice


async def test_a_prefill_stopped_before_it_parks_drops_its_room(hf_engine: Any) -> None:
    """A client that leaves while its prefill runs: the prefill parks nothing, its room is gone
    at once (not left for the TTL), and a decode waiting on it hears why."""
    from dynamo_nb.runtime.context import Context

    await hf_engine.start_bootstrap()
    info = {**hf_engine.bootstrap.endpoint, "bootstrap_room": draw_room(), "bootstrap_token": draw_token()}
    waiting = asyncio.ensure_future(fetch_kv(BootstrapInfo.parse(info), timeout=10))
    await asyncio.sleep(0.05)  # the decode waits on the room
    context = Context()
    stream = hf_engine.prefill(req({**GREEDY, "bootstrap_info": info}), context)
    first = (await stream.__anext__()).to_dict()
    assert first["disaggregated_params"]["bootstrap_room"] == info["bootstrap_room"]
    context.stop_generating()  # the client left
    rest = await collect(stream)
    assert rest[-1]["finish_reason"] == "cancelled"
    assert hf_engine.bootstrap.rooms == 0 and hf_engine.bootstrap.parked == 0
    with pytest.raises(DisaggregationError, match="cancelled"):
        await waiting
