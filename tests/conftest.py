"""Shared fixtures: real etcd and nats-server for the session, runtimes, worker subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import dynamo_nb
from dynamo_nb import DistributedRuntime, LocalServices

ROOT = Path(__file__).resolve().parents[1]
ECHO_WORKER = ROOT / "components" / "echo_worker.py"
HF_WORKER = ROOT / "components" / "hf_worker.py"
FRONTEND = ROOT / "components" / "frontend.py"

# (discovery, request plane): every combination a user can pick.
MODES = ["memory-inproc", "memory-tcp", "etcd-tcp", "etcd-nats", "static-nats"]


@pytest.fixture(scope="session")
async def services() -> AsyncIterator[LocalServices]:
    services = await LocalServices.start()
    yield services
    await services.stop()


RuntimeFactory = Callable[[str], Awaitable[DistributedRuntime]]


@pytest.fixture
async def make_runtime(services: LocalServices) -> AsyncIterator[RuntimeFactory]:
    """``await make_runtime("etcd-tcp")`` → a runtime in that mode, shut down after the test."""
    made: list[DistributedRuntime] = []

    async def make(mode: str, **kwargs: object) -> DistributedRuntime:
        discovery, plane = mode.split("-")
        spec = {"memory": "memory", "etcd": services.etcd_url, "static": "static"}[discovery]
        runtime = await DistributedRuntime.create(spec, plane, services.nats_url, **kwargs)  # type: ignore[arg-type]
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        await runtime.shutdown(grace=0.5)


class WorkerProcess:
    """A component started as a subprocess; its stdout's READY line says it serves."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self.ready_line = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.process.returncode is None:
            try:
                os.kill(self.process.pid, signum)
            except ProcessLookupError:
                pass

    async def wait(self, timeout: float = 10.0) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)


@pytest.fixture
async def start_worker(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[WorkerProcess]]]:
    """``await start_worker(*flags, script=ECHO_WORKER)`` → a ready `WorkerProcess` (killed after the test)."""
    started: list[WorkerProcess] = []

    async def start(*flags: str, script: Path = ECHO_WORKER, timeout: float = 60.0) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        with open(log, "wb") as err:  # noqa: ASYNC230
            process = await asyncio.create_subprocess_exec(
                sys.executable, str(script), *flags, stdout=asyncio.subprocess.PIPE, stderr=err, cwd=str(ROOT)
            )
        worker = WorkerProcess(process, log)
        started.append(worker)
        assert process.stdout is not None
        try:
            while True:
                line = (await asyncio.wait_for(process.stdout.readline(), timeout)).decode()
                if not line:
                    raise AssertionError(f"worker exited before READY; log:\n{log.read_text()[-3000:]}")
                if line.startswith("READY"):
                    worker.ready_line = line.strip()
                    return worker
        except asyncio.TimeoutError:
            raise AssertionError(
                f"worker not READY within {timeout} s; log:\n{log.read_text()[-3000:]}"
            ) from None

    yield start
    for worker in started:
        worker.kill(signal.SIGTERM)
        try:
            await worker.wait(5)
        except asyncio.TimeoutError:
            worker.kill()
            await worker.wait(5)


async def collect(stream: object) -> list[object]:
    return [item async for item in stream]  # type: ignore[attr-defined]


__all__ = [
    "ECHO_WORKER",
    "FRONTEND",
    "HF_WORKER",
    "MODES",
    "ROOT",
    "WorkerProcess",
    "collect",
    "dynamo_nb",
    "free_port",
]


# -- LLM serving: the built-in tiny model and one hf engine for the whole session


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    from dynamo_nb.models import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
async def hf_engine(tiny_path: Path) -> AsyncIterator[Any]:
    from dynamo_nb.engines import HFEngine

    engine = await HFEngine.load(tiny_path)
    yield engine
    await engine.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
