"""The KV router's policy (Dynamo 1.7's knobs and names), changed live through the frontend's
authenticated admin API: off unless configured, a stranger, a wrong token, an altered, stale or
replayed signature refused; a change applies between two decisions with no request lost."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port, metric_value, until

from dynamo_nb import ConfigError, DistributedRuntime, bench
from dynamo_nb.engines import EchoEngine
from dynamo_nb.errors import AdminAuthError
from dynamo_nb.flags import frontend_parser
from dynamo_nb.frontend import Frontend
from dynamo_nb.frontend.admin import SIGNATURE_HEADER, AdminAuth, sign_admin_request
from dynamo_nb.frontend.config import FrontendConfig
from dynamo_nb.http import fetch
from dynamo_nb.llm import serve_llm
from dynamo_nb.router.kv import KvRouterConfig
from dynamo_nb.router.policy import RouterPolicy
from dynamo_nb.runtime.security import ClusterSecret

TOKEN = "an-admin-token-of-some-length"
SECRET = ClusterSecret(b"the cluster secret, 32 bytes at least")


def test_the_knobs_take_dynamos_names_and_the_older_ones() -> None:
    policy = RouterPolicy().changed(
        {"--router-kv-overlap-score-credit": 0.5, "kv_overlap_score_weight": 8, "router-temperature": 0.2}
    )
    assert policy == RouterPolicy(overlap_score_credit=0.5, prefill_load_scale=8, temperature=0.2)
    assert RouterPolicy().differences(policy) == {
        "overlap_score_credit": (1.0, 0.5),
        "prefill_load_scale": (1.0, 8.0),
        "temperature": (0.0, 0.2),
    }
    for bad in ({"temperature": -1}, {"prefill_load_scale": math.inf}, {"overlap_score_credit": "1"}):
        with pytest.raises(ConfigError, match="must be"):
            RouterPolicy().changed(bad)
    with pytest.raises(ConfigError, match="use overlap_score_credit, prefill_load_scale or temperature"):
        RouterPolicy().changed({"overlap_weight_typo": 1})


def test_the_frontend_flags_set_the_policy() -> None:
    def config(*flags: str) -> FrontendConfig:
        return FrontendConfig.from_args(frontend_parser().parse_args(["--router-mode", "kv", *flags]))

    assert config().kv.policy == RouterPolicy()
    assert config("--router-prefill-load-scale", "16").kv.policy.prefill_load_scale == 16
    assert config("--kv-overlap-score-weight", "4").kv.policy.prefill_load_scale == 4  # the older name
    both = ("--kv-overlap-score-weight", "4", "--router-prefill-load-scale", "8")
    with pytest.raises(ConfigError, match="older name of --router-prefill-load-scale"):
        config(*both)
    with pytest.raises(ConfigError, match="overlap_score_credit must be finite and 0 or more"):
        config("--router-kv-overlap-score-credit", "-1")
    assert not config().admin_enabled and config("--admin-token-file", "t").admin_enabled
    from dynamo_nb.frontend.config import check_frontend_args

    etcd = ["--discovery", "etcd://127.0.0.1:2379", "--admin-api", "--http-workers", "2"]
    with pytest.raises(ConfigError, match="add --nats-url"):  # the processes share a change over it
        check_frontend_args(frontend_parser().parse_args(etcd))
    check_frontend_args(frontend_parser().parse_args([*etcd, "--nats-url", "nats://127.0.0.1:4222"]))
    with pytest.raises(ConfigError, match=r"--router-policy-group shares .* add --nats-url"):
        check_frontend_args(frontend_parser().parse_args([*etcd[:2], "--router-policy-group", "fleet"]))
    assert config("--router-policy-group", "fleet").router_policy_group == "fleet"


async def start(tiny_path: Any, namespace: str, admin: AdminAuth | None) -> tuple[list[Any], Frontend]:
    """Two echo workers of one model (block size 4) behind a KV-routing frontend."""
    runtimes = [await DistributedRuntime.create() for _ in range(3)]
    for runtime in runtimes[:2]:
        endpoint = runtime.endpoint(f"{namespace}.backend.generate")
        await serve_llm(
            endpoint, EchoEngine().generate, tiny_path, model_name=namespace, kv_cache_block_size=4
        )
    frontend = await Frontend.start(
        runtimes[2], port=0, router_mode="kv", kv=KvRouterConfig(use_kv_events=False), admin=admin
    )
    await bench.wait_for_model(frontend.url, namespace, instances=2, timeout=10)
    return runtimes, frontend


async def stop(runtimes: list[Any], frontend: Frontend) -> None:
    await frontend.stop()
    for runtime in runtimes:
        await runtime.shutdown()


def signed(body: bytes, secret: ClusterSecret = SECRET, now: float | None = None) -> dict[str, str]:
    return {SIGNATURE_HEADER: sign_admin_request(secret, "PATCH", "/router_policy", body, now=now)}


def test_a_bearer_token_sent_to_a_frontend_without_one_is_told_to_sign_instead() -> None:
    with pytest.raises(
        AdminAuthError, match=r"no admin token \(started without --admin-token-file\): sign"
    ) as refused:
        AdminAuth(secret=SECRET).check("GET", "/router_policy", {"authorization": f"Bearer {TOKEN}"}, b"")
    assert refused.value.http_status == 403


async def test_the_admin_routes_are_off_unless_configured(tiny_path: Any) -> None:
    runtimes, frontend = await start(tiny_path, "polo", admin=None)
    try:
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            for method in ("GET", "PATCH"):
                answer = await http.request(method, "/router_policy", json={"temperature": 1})
                assert answer.status_code == 404, answer.text
                assert "--admin-token-file" in answer.json()["error"]["message"]
                assert answer.json()["error"]["type"] == "not_found_error"  # no credentials were wrong
        assert frontend.models.kv_router_policy() == RouterPolicy()
    finally:
        await stop(runtimes, frontend)


async def test_the_admin_api_refuses_strangers_and_replays_and_takes_the_token_or_the_secret(
    tiny_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dynamo_nb.frontend")
    runtimes, frontend = await start(tiny_path, "pola", admin=AdminAuth(TOKEN, SECRET))
    try:
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:

            async def patch(body: bytes, headers: dict[str, str]) -> httpx.Response:
                return await http.patch("/router_policy", content=body, headers=headers)

            change = json.dumps({"prefill_load_scale": 32, "overlap_score_credit": 1.5}).encode()
            stranger = await patch(change, {})
            assert stranger.status_code == 401 and "needs credentials" in stranger.text
            for headers in ({"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}):
                malformed = await patch(change, headers)
                assert malformed.status_code == 401, (headers, malformed.text)
                assert "must read 'Bearer <token>'" in malformed.text and TOKEN not in malformed.text
            for headers in (
                {"Authorization": "Bearer a-wrong-token-of-some-length"},
                signed(change, ClusterSecret(b"another secret of 32 bytes or so..")),
                signed(b'{"prefill_load_scale": 1}'),  # signed for another body: altered
                signed(change, now=1_000_000_000),  # stale
                {SIGNATURE_HEADER: "t=1,n=x,s=y"},
            ):
                refused = await patch(change, headers)
                assert refused.status_code == 403, (headers, refused.text)
                assert refused.json()["error"]["type"] == "authentication_error"
            assert frontend.models.kv_router_policy() == RouterPolicy()  # nothing changed so far

            headers = signed(change)
            accepted = await patch(change, headers)
            assert accepted.status_code == 200, accepted.text
            assert accepted.json()["changed"] == {
                "prefill_load_scale": {"old": 1.0, "new": 32.0},
                "overlap_score_credit": {"old": 1.0, "new": 1.5},
            }
            replayed = await patch(change, headers)
            assert replayed.status_code == 403 and "replay" in replayed.text
            changes = [
                r.getMessage() for r in caplog.records if "router policy was changed" in r.getMessage()
            ]
            assert len(changes) == 1 and "by the cluster secret from 127.0.0.1:" in changes[0], changes
            assert "prefill_load_scale 1 → 32" in changes[0] and "overlap_score_credit 1 → 1.5" in changes[0]

            shown = await http.get("/router_policy", headers={"Authorization": f"Bearer {TOKEN}"})
            assert shown.json() == {
                "policy": {"overlap_score_credit": 1.5, "prefill_load_scale": 32.0, "temperature": 0.0}
            }
            for bad, word in (
                (b'{"temperature": -1}', "0 or more"),
                (b'{"weight": 1}', "unknown"),
                (b"[1]", "object"),
            ):
                answer = await patch(bad, {"Authorization": f"Bearer {TOKEN}"})
                assert answer.status_code == 400 and word in answer.text, answer.text
            metrics = (await http.get("/metrics")).text
            assert 'dynamo_frontend_router_policy{knob="prefill_load_scale"} 32.0' in metrics
            assert 'dynamo_frontend_router_policy_changes_total{by="the cluster secret"} 1.0' in metrics
    finally:
        await stop(runtimes, frontend)


async def test_a_policy_change_applies_between_two_decisions_with_no_request_lost(tiny_path: Any) -> None:
    runtimes, frontend = await start(tiny_path, "polc", admin=AdminAuth(TOKEN))
    router = frontend.models.get("polc").router
    try:
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:

            async def complete(i: int) -> str:
                body = {"model": "polc", "prompt": [*range(10, 42), i], "max_tokens": 8, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    text = "".join([line async for line in response.aiter_lines()])
                return f"{response.status_code} {'[DONE]' in text} {response.headers['x-request-id']}"

            async def decided(count: int) -> None:
                for _ in range(600):  # each wave's requests are routed before the next change
                    if len(frontend.routing_records) >= count:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"{len(frontend.routing_records)} of {count} requests routed")

            streams = []
            for wave, scale in enumerate((2, 8, 32, None)):
                streams += [asyncio.create_task(complete(10 * wave + i)) for i in range(10)]
                await decided(len(streams))
                if scale is not None:  # while the wave's streams may still run
                    answer = await http.patch(
                        "/router_policy",
                        json={"prefill_load_scale": scale},
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    )
                    assert answer.status_code == 200, answer.text
            results = await asyncio.gather(*streams)
        assert all(r.startswith("200 True") for r in results), results  # none lost
        scales = []
        for decision in frontend.routing_records:  # in the order they were made
            assert decision.policy is not None
            scale = decision.policy["prefill_load_scale"]
            scales.append(scale)
            for candidate in decision.candidates:  # each decided wholly by one policy
                parts = candidate.parts
                assert candidate.score == pytest.approx(
                    scale * parts["prefill_blocks"] + parts["decode_blocks"]
                )
        assert scales == [1.0] * 10 + [2.0] * 10 + [8.0] * 10 + [32.0] * 10  # each change at once, for all
        assert router.policy.prefill_load_scale == 32
    finally:
        await stop(runtimes, frontend)


async def test_frontends_of_a_group_share_a_change_agree_on_a_race_and_a_late_one_catches_up() -> None:
    runtime = await DistributedRuntime.create()
    kv = KvRouterConfig(use_kv_events=False)
    fronts = [await Frontend.start(runtime, port=0, router_mode="kv", kv=kv) for _ in range(4)]
    a, b, other, late = fronts
    try:
        group = (await a.models.share_kv_router_policy(heartbeat=0.05)).group
        await b.models.share_kv_router_policy(group, heartbeat=0.05)
        await other.models.share_kv_router_policy(heartbeat=0.05)  # a group of its own
        a.models.change_kv_router_policy({"prefill_load_scale": 8}, by="a test")
        await until(
            lambda: b.models.kv_router_policy().prefill_load_scale == 8,
            timeout=20,
            step=0.01,
            what="b took a's change",
        )
        assert b.models.policy_sync is not None and b.models.policy_sync.received == 1
        # two changes at once, one on each: both end on the one with the higher version
        a.models.change_kv_router_policy({"temperature": 0.5})
        b.models.change_kv_router_policy({"temperature": 0.25})
        syncs = [a.models.policy_sync, b.models.policy_sync]
        await until(lambda: syncs[0].version == syncs[1].version, timeout=20, step=0.01, what="a and b agree")  # type: ignore[union-attr]
        winner = a if syncs[0].version[1] == syncs[0].sender else b  # type: ignore[union-attr]
        expected = RouterPolicy(prefill_load_scale=8, temperature=0.5 if winner is a else 0.25)
        assert a.models.kv_router_policy() == b.models.kv_router_policy() == expected
        # a process that missed the changes (started after them) takes them from the heartbeat
        await late.models.share_kv_router_policy(group, heartbeat=0.05)
        await until(
            lambda: late.models.kv_router_policy() == expected,
            timeout=20,
            step=0.01,
            what="the late one caught up",
        )
        assert other.models.kv_router_policy() == RouterPolicy()  # another group saw nothing
    finally:
        for front in fronts:
            await front.stop()
        await runtime.shutdown()


@pytest.mark.processes
async def test_a_change_through_one_of_http_workers_reaches_the_others(
    services: Any, start_worker: Any, tmp_path: Any
) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    await start_worker(*bus, "--endpoint", "polw.backend.generate", script=MOCKER_WORKER)
    port = free_port()
    await start_worker(*bus, "--http-port", str(port), "--http-workers", "2", "--router-mode", "kv",
                       "--admin-token-file", str(token_file), script=FRONTEND)  # fmt: skip
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {TOKEN}"}
    status, body = await fetch(url + "/router_policy", method="PATCH", body=b'{"prefill_load_scale": 16}',
                               headers=auth)  # fmt: skip
    assert status == 200, body
    # each scrape is a new connection, which the kernel hands to either process: one changed the
    # policy itself, the other took it from the first; both run it
    sources: set[str] = set()
    for _ in range(500):
        text = (await fetch(url + "/metrics"))[1].decode()
        by = set(re.findall(r'dynamo_frontend_router_policy_changes_total\{by="([^"]+)"\} 1', text))
        if by:
            assert metric_value(text, "dynamo_frontend_router_policy", knob="prefill_load_scale") == 16.0
        sources |= by
        if sources == {"the admin token", "another frontend process"}:
            break
        await asyncio.sleep(0.02)
    assert sources == {"the admin token", "another frontend process"}, sources


@pytest.mark.processes
async def test_frontends_of_one_router_policy_group_follow_the_one_patched(
    services: Any, start_worker: Any, tmp_path: Any
) -> None:
    """Two frontends of a fleet (``--router-policy-group``): the one with the admin API is
    patched, the other (no admin API of its own) follows; a third, of no group, does not."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    await start_worker(*bus, "--endpoint", "polg.backend.generate", script=MOCKER_WORKER)
    ports = [free_port() for _ in range(3)]
    fleet = ["--router-mode", "kv", "--router-policy-group", "fleet-a"]
    await start_worker(*bus, "--http-port", str(ports[0]), *fleet, "--admin-token-file", str(token_file),
                       script=FRONTEND)  # fmt: skip
    await start_worker(*bus, "--http-port", str(ports[1]), *fleet, script=FRONTEND)
    await start_worker(*bus, "--http-port", str(ports[2]), "--router-mode", "kv", script=FRONTEND)
    patched = await fetch(f"http://127.0.0.1:{ports[0]}/router_policy", method="PATCH",
                          body=b'{"overlap_score_credit": 0.5}', headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert patched[0] == 200, patched

    async def credit(port: int) -> float | None:
        text = (await fetch(f"http://127.0.0.1:{port}/metrics"))[1].decode()
        return metric_value(text, "dynamo_frontend_router_policy", knob="overlap_score_credit")

    async def followed() -> bool:
        return await credit(ports[1]) == 0.5

    await until(followed, timeout=10, step=0.02)
    assert await credit(ports[1]) == 0.5 and await credit(ports[2]) == 1.0
    text = (await fetch(f"http://127.0.0.1:{ports[1]}/metrics"))[1].decode()
    assert (
        metric_value(text, "dynamo_frontend_router_policy_changes_total", by="another frontend process") == 1
    )
