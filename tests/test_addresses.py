"""Listen and advertised addresses on one host: the rule, and each server that follows it (the
TCP plane, the bootstrap server, the frontend's URL). Across hosts: tests/test_across_hosts.py."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.bootstrap import BootstrapServer
from dynamo_nb.errors import ConfigError
from dynamo_nb.flags import hf_worker_parser
from dynamo_nb.runtime.addresses import AddressRule, free_port, route_source, service_hosts
from dynamo_nb.runtime.security import PlaneSecurity


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


async def advertised_and_answered(tcp_host: str) -> str:
    """The address an echo endpoint on a TCP plane listening on ``tcp_host`` advertises, once a
    request to it went through."""
    trusting = PlaneSecurity(allow_unauthenticated=True)  # a wildcard is off loopback
    runtime = await DistributedRuntime.create("memory", "tcp", tcp_host=tcp_host, security=trusting)
    try:

        async def handler(request: object) -> object:
            yield request

        server = await runtime.endpoint("addr.echo.generate").serve(handler)
        client = await runtime.endpoint("addr.echo.generate").client()
        assert [item async for item in client.round_robin({"x": 1})] == [{"x": 1}]
        return str(server.instance.transport["address"])
    finally:
        await runtime.shutdown(grace=0)


async def test_a_tcp_plane_on_a_wildcard_advertises_a_reachable_address() -> None:
    assert (await advertised_and_answered("0.0.0.0")).startswith("127.0.0.1:")  # loopback, never 0.0.0.0
    with pytest.raises(ConfigError, match="nobody can connect to a wildcard"):
        await DistributedRuntime.create("memory", "tcp", tcp_advertise_host="::")


async def test_a_bootstrap_server_advertises_what_decode_workers_can_reach() -> None:
    with pytest.raises(ConfigError, match="cannot advertise"):
        await BootstrapServer.start("127.0.0.1", advertise_host="0.0.0.0")
    for listen, advertise in (("0.0.0.0", None), ("0.0.0.0", "127.0.0.1"), ("localhost", None)):
        trusting = PlaneSecurity(allow_unauthenticated=True)
        server = await BootstrapServer.start(listen, advertise_host=advertise, security=trusting)
        try:  # never the wildcard: loopback unless told (a worker tells it the address others reach)
            assert server.endpoint["bootstrap_host"] == "127.0.0.1" and server.endpoint["bootstrap_port"] > 0
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.close()
        finally:
            await server.stop()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_wildcard_advertises_an_ipv6_address() -> None:
    assert (await advertised_and_answered("::")).startswith("[::1]:")  # a socket on :: takes IPv6 only


def test_the_flags_name_both_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TCP_HOST", "TCP_ADVERTISE_HOST", "BOOTSTRAP_HOST", "BOOTSTRAP_ADVERTISE_HOST"):
        monkeypatch.delenv(f"DYN_NB_{name}", raising=False)
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


@pytest.mark.skipif(
    not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux's ephemeral port range"
)
def test_a_port_bound_later_is_drawn_where_no_bind_to_port_0_lands() -> None:
    """An engine binds its side channel tens of seconds after the port was chosen: the port comes
    from below the kernel's ephemeral range, which ``bind(0)`` and outgoing connections use."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port(bound_later=True) for _ in range(20)}
    assert all(1024 < port < low for port in ports), (ports, low)
    assert len(ports) > 1  # drawn, not one fixed port two workers would share
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))  # and free
