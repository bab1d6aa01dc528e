"""LocalServices: real etcd and nats-server as child processes."""

from __future__ import annotations

import asyncio
import os

import pytest

from dynamo_nb import LocalServices
from dynamo_nb.errors import BinaryNotFoundError, ServiceError
from dynamo_nb.launch.services import INSTALL_HINTS, find_binary

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]


async def test_start_answer_and_stop() -> None:
    services = await LocalServices.start()
    etcd_port = int(str(services.etcd_url).rsplit(":", 1)[1])
    nats_port = int(str(services.nats_url).rsplit(":", 1)[1])
    assert str(services.etcd_url).startswith("etcd://127.0.0.1:")
    assert str(services.nats_url).startswith("nats://127.0.0.1:")
    children = [c.process for c in services._children.values()]
    for port in (etcd_port, nats_port):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
    await services.stop()
    assert all(p.poll() is not None for p in children)
    for port in (etcd_port, nats_port):
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
    assert not services.workdir.exists()


async def test_only_what_is_asked_for() -> None:
    async with await LocalServices.start(etcd=False) as services:
        assert services.etcd_url is None
        assert str(services.nats_url).startswith("nats://")


def test_binaries_are_found() -> None:
    assert os.access(find_binary("etcd"), os.X_OK)
    assert os.access(find_binary("nats-server"), os.X_OK)


def test_a_missing_binary_names_both_ways_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        INSTALL_HINTS, "no-such-server", ("no-such-server-bin", "no-such-server", "DYN_NB_NOPE_BIN")
    )
    with pytest.raises(BinaryNotFoundError) as info:
        find_binary("no-such-server")
    message = str(info.value)
    assert "pip install no-such-server-bin" in message
    assert "apt-get install no-such-server" in message
    assert "DYN_NB_NOPE_BIN" in message
    assert isinstance(info.value, ServiceError)


def test_services_stop_when_the_interpreter_exits(tmp_path: object) -> None:
    """A script that never calls stop() leaves no etcd or nats-server behind."""
    import subprocess
    import sys

    script = (
        "import asyncio, dynamo_nb\n"
        "async def main():\n"
        "    s = await dynamo_nb.LocalServices.start()\n"
        "    print(*[c.process.pid for c in s._children.values()], flush=True)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    alive = [pid for pid in pids if _running(pid)]
    assert not alive, f"service processes {alive} outlived the interpreter"


def test_services_stop_when_their_process_is_sigkilled() -> None:
    """No clean-up runs after SIGKILL: etcd and nats-server get SIGTERM from the kernel (parent death)."""
    import subprocess
    import sys
    import time

    script = (
        "import asyncio, os, signal, dynamo_nb\n"
        "async def main():\n"
        "    s = await dynamo_nb.LocalServices.start()\n"
        "    print(*[c.process.pid for c in s._children.values()], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9, result.stderr
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if _running(pid)]
        time.sleep(0.05)
    assert not alive, f"service processes {alive} outlived their SIGKILLed parent"


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
