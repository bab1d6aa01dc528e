"""The multi-host harness itself: hosts in network namespaces on a user-space switch.

Isolation (no route out, a host's loopback is its own), delay and loss as shaped, cuts that
answer nothing and heal, processes launched inside a host, and a teardown that leaves no
namespace or process behind — after `stop`, and after the owner is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import statistics
import time
from pathlib import Path

import pytest
from helpers import ROOT, pid_gone

from dynamo_nb import launch
from dynamo_nb.errors import ConfigError
from dynamo_nb.testing.hosts import HostNetwork, our_netns

ECHO_SERVER = """
import asyncio, signal, sys
if "--ignore-sigterm" in sys.argv:  # only SIGKILL stops it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(echo, sys.argv[1], 7000)
    print("READY echo", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


@pytest.fixture
def echo_script(tmp_path: Path) -> Path:
    path = tmp_path / "echo_server.py"
    path.write_text(ECHO_SERVER)
    return path


async def connect_ms(net: HostNetwork, client: str, server: str, port: int = 7000) -> float:
    start = time.perf_counter()
    _, writer = await net[client].open_connection(net[server].address, port)
    elapsed = (time.perf_counter() - start) * 1000
    writer.close()
    return elapsed


async def test_bad_settings_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match=r"inside 198\.18\.0\.0/15"):
        await HostNetwork.start(2, subnet="10.0.0.0/24")
    with pytest.raises(ConfigError, match="lowercase letters"):
        await HostNetwork.start(["Bad Name"])
    with pytest.raises(ConfigError, match="distinct"):
        await HostNetwork.start(["a", "a"])
    with pytest.raises(ConfigError, match="name them"):
        await HostNetwork.start(27)


@pytest.mark.netns
@pytest.mark.processes
async def test_hosts_reach_each_other_and_nothing_else(echo_script: Path, tmp_path: Path) -> None:
    async with await HostNetwork.start(["a", "b"]) as net:
        assert net["a"].address == "198.18.0.2" and net["b"].address == "198.18.0.3"
        server = await net["a"].launch(echo_script, net["a"].address, show_logs=False, log_dir=tmp_path)
        assert server.host is net["a"]
        reader, writer = await net["b"].open_connection(net["a"].address, 7000)
        writer.write(b"across")
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"across"
        writer.close()
        # the host's loopback is its own: the echo server on a's address is not on b's loopback
        with pytest.raises(ConnectionRefusedError):
            await net["b"].open_connection("127.0.0.1", 7000)
        # no route out of the test network
        with pytest.raises(OSError) as unreachable:
            await net["b"].open_connection("192.0.2.1", 80, timeout=2)
        assert unreachable.value.errno == errno.ENETUNREACH
        with net["b"].entered():
            reader, writer = await asyncio.open_connection(net["a"].address, 7000)
        writer.write(b"entered")
        assert await asyncio.wait_for(reader.readexactly(7), 5) == b"entered"
        writer.close()


@pytest.mark.netns
@pytest.mark.processes
async def test_delay_sets_the_round_trip_and_loss_drops_frames_that_tcp_resends(
    echo_script: Path, tmp_path: Path
) -> None:
    async with await HostNetwork.start(["a", "b"]) as net:
        await net["a"].launch(echo_script, net["a"].address, show_logs=False, log_dir=tmp_path)
        await connect_ms(net, "b", "a")  # ARP settles
        plain = statistics.median([await connect_ms(net, "b", "a") for _ in range(5)])
        await net.shape(delay_ms=5)
        delayed = statistics.median([await connect_ms(net, "b", "a") for _ in range(5)])
        print(f"connect (one round trip): {plain:.2f} ms plain, {delayed:.2f} ms at 5 ms one way")
        assert (
            delayed >= 8.5 > plain
        )  # a TCP connect is one round trip: 2 x 5 ms (frames leave ≤ 0.5 ms early)

        await net.shape(loss=0.05)
        before = (await net.stats())["b"]["lost"]
        reader, writer = await net["b"].open_connection(net["a"].address, 7000)
        payload = os.urandom(400_000)
        writer.write(payload)
        echoed = await asyncio.wait_for(reader.readexactly(len(payload)), 60)
        writer.close()
        assert echoed == payload  # every byte, in order: TCP resent what the switch dropped
        stats = await net.stats()
        assert stats["b"]["lost"] > before and stats["a"]["received"] > 0

        await net.shape()
        await net.rate("a", 8)  # a sends at most 8 Mbit/s (1 MB/s): 400 kB take at least 0.35 s
        reader, writer = await net["b"].open_connection(net["a"].address, 7000)
        start = time.perf_counter()
        writer.write(payload)
        assert await asyncio.wait_for(reader.readexactly(len(payload)), 60) == payload
        writer.close()
        assert time.perf_counter() - start >= 0.3
        await net.rate("a", None)


@pytest.mark.netns
@pytest.mark.processes
async def test_a_cut_host_answers_nothing_until_healed(echo_script: Path, tmp_path: Path) -> None:
    async with await HostNetwork.start(["a", "b", "c"]) as net:
        await net["a"].launch(echo_script, net["a"].address, show_logs=False, log_dir=tmp_path)
        reader, writer = await net["b"].open_connection(net["a"].address, 7000)
        await net.cut("a")
        writer.write(b"during the cut")
        with pytest.raises(asyncio.TimeoutError):  # no reset, no answer: silence
            await asyncio.wait_for(reader.readexactly(14), 1.0)
        with pytest.raises(asyncio.TimeoutError):  # not refused either: a connect just waits
            await net["c"].open_connection(net["a"].address, 7000, timeout=1.0)
        await net.heal("a")
        assert await asyncio.wait_for(reader.readexactly(14), 15) == b"during the cut"  # resent
        writer.close()
        # a cut between two hosts only
        await net.cut("a", "b")
        with pytest.raises(asyncio.TimeoutError):
            await net["b"].open_connection(net["a"].address, 7000, timeout=1.0)
        assert await connect_ms(net, "c", "a") >= 0
        await net.heal()
        assert await connect_ms(net, "b", "a") >= 0
        assert (await net.stats())["b"]["cut"] > 0
        with pytest.raises(ConfigError, match="no host 'x'"):
            await net.cut("x")
        with pytest.raises(ConfigError, match="name the first host"):
            await net.shape(None, "b", delay_ms=1)  # counted on the sender: b wrote to a during the cut


@pytest.mark.netns
@pytest.mark.processes
async def test_stop_leaves_no_namespace_or_process(echo_script: Path, tmp_path: Path) -> None:
    net = await HostNetwork.start(["a", "b"])
    names = {host.netns for host in net.hosts.values()}
    assert names <= set(our_netns())
    server = await net["a"].launch(echo_script, net["a"].address, show_logs=False, log_dir=tmp_path)
    await net.stop()
    assert not names & set(our_netns())
    assert await pid_gone(server.pid)
    assert not net.running
    with pytest.raises(ConfigError, match="stopped"):
        await net.cut("a")


OWNER = """
import asyncio, sys
from dynamo_nb.testing.hosts import HostNetwork
async def main():
    net = await HostNetwork.start(["a", "b"])
    server = await net["a"].launch(sys.argv[1], net["a"].address, "--ignore-sigterm", show_logs=False)
    names = ",".join(h.netns for h in net.hosts.values())
    print(f"READY owner server={server.pid} switch={net._switch.pid} netns={names}", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.mark.netns
@pytest.mark.processes
async def test_an_owner_killed_with_sigkill_leaves_nothing_behind(echo_script: Path, tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = await launch(script, echo_script, cwd=ROOT, show_logs=False, log_dir=tmp_path, timeout=60)
    fields = dict(part.split("=", 1) for part in owner.ready_line.split()[2:])
    names = set(fields["netns"].split(","))
    assert names <= set(our_netns())
    os.kill(owner.pid, signal.SIGKILL)  # the owner alone: no clean-up of its own runs
    # the server ignores the SIGTERM its launcher's death sends it: the switch's SIGKILL ends it
    assert await pid_gone(int(fields["server"]), timeout=10)
    assert await pid_gone(int(fields["switch"]), timeout=10)
    for _ in range(100):
        if not names & set(our_netns()):
            break
        await asyncio.sleep(0.1)
    assert not names & set(our_netns()), f"left behind: {names & set(our_netns())}"
    await owner.stop()
