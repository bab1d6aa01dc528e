"""Listen and advertised addresses on one host: the rule, and each server that follows it (the
TCP plane, the bootstrap server, the frontend's URL). Across hosts: tests/test_across_hosts.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.bootstrap import BootstrapServer
from dynamo_nb.errors import ConfigError
from dynamo_nb.flags import hf_worker_parser
from dynamo_nb.runtime.addresses import AddressRule, route_source, service_hosts


def test_local_discovery_means_loopback() -> None:
    for urls in (
        ["memory", None],
        ["file:///tmp/d", None],
        ["etcd://127.0.0.1:2379", "nats://localhost:4222"],
    ):
        rule = AddressRule.toward(urls)
        assert rule.remote is None
        assert rule.listen(None) == "127.0.0.1" and rule.advertise("0.0.0.0") == "127.0.0.1"
    assert AddressRule.toward(["etcd://127.0.0.1:1", "nats://10.9.8.7:4222"]).remote == "10.9.8.7"
    assert service_hosts(["nats://a:1,nats://b:2", "static"]) == ["a", "b"]


def test_given_hosts_win_and_a_wildcard_is_never_advertised(caplog: pytest.LogCaptureFixture) -> None:
    rule = AddressRule(remote="198.18.0.2")
    assert rule.listen("10.1.2.3") == "10.1.2.3" and rule.advertise("10.1.2.3") == "10.1.2.3"
    assert rule.advertise("0.0.0.0", "10.1.2.4") == "10.1.2.4"
    with pytest.raises(ConfigError, match=r"cannot advertise '0\.0\.0\.0' for the TCP plane"):
        rule.advertise("0.0.0.0", "0.0.0.0", what="the TCP plane")
    with caplog.at_level(logging.WARNING, "dynamo_nb.addresses"):
        assert rule.advertise("127.0.0.1", what="the TCP plane") == "127.0.0.1"
    assert "other hosts cannot reach it" in caplog.text


def test_the_route_source_is_an_address_of_this_machine() -> None:
    assert route_source("127.0.0.1") == "127.0.0.1"
    with pytest.raises(ConfigError, match="cannot resolve"):
        route_source("no-such-host.invalid")


async def test_a_tcp_plane_on_a_wildcard_advertises_a_reachable_address() -> None:
    runtime = await DistributedRuntime.create("memory", "tcp", tcp_host="0.0.0.0")
    try:

        async def handler(request: object) -> object:
            yield request

        server = await runtime.endpoint("addr.echo.generate").serve(handler)
        host, _port = server.instance.transport["address"].rsplit(":", 1)
        assert host == "127.0.0.1"  # memory discovery: loopback, never 0.0.0.0
        client = await runtime.endpoint("addr.echo.generate").client()
        assert [item async for item in client.round_robin({"x": 1})] == [{"x": 1}]
    finally:
        await runtime.shutdown(grace=0)
    with pytest.raises(ConfigError, match="nobody can connect to a wildcard"):
        await DistributedRuntime.create("memory", "tcp", tcp_advertise_host="::")


async def test_a_bootstrap_server_advertises_what_decode_workers_can_reach() -> None:
    with pytest.raises(ConfigError, match="needs advertise_host"):
        await BootstrapServer.start("0.0.0.0")
    server = await BootstrapServer.start("0.0.0.0", advertise_host="127.0.0.1")
    try:
        assert server.endpoint["bootstrap_host"] == "127.0.0.1" and server.endpoint["bootstrap_port"] > 0
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.close()
    finally:
        await server.stop()


def test_the_flags_name_both_hosts() -> None:
    args = hf_worker_parser().parse_args(
        [
            "--tcp-host",
            "0.0.0.0",
            "--tcp-advertise-host",
            "10.0.0.5",
            "--bootstrap-advertise-host",
            "10.0.0.5",
        ]
    )
    assert (args.tcp_host, args.tcp_advertise_host, args.bootstrap_advertise_host) == (
        "0.0.0.0",
        "10.0.0.5",
        "10.0.0.5",
    )
    defaults = hf_worker_parser().parse_args([])
    assert defaults.tcp_host is None and defaults.bootstrap_host is None  # picked by AddressRule


async def test_a_frontend_on_a_wildcard_gives_a_url_clients_can_use() -> None:
    from dynamo_nb.frontend import Frontend

    runtime = await DistributedRuntime.create()
    frontend = await Frontend.start(runtime, host="0.0.0.0", port=0)
    try:
        assert frontend.url.startswith("http://127.0.0.1:") and not frontend.url.endswith(":0")
    finally:
        await frontend.stop()
        await runtime.shutdown(grace=0)
