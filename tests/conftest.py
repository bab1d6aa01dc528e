"""Shared fixtures: real etcd and nats-server for the session, runtimes, worker subprocesses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import ECHO_WORKER, ROOT, RuntimeFactory, hf_frontends

from dynamo_nb import DistributedRuntime, LocalServices, ManagedProcess, launch


@pytest.fixture(scope="session")
async def services() -> AsyncIterator[LocalServices]:
    services = await LocalServices.start()
    yield services
    await services.stop()


@pytest.fixture
async def make_runtime(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RuntimeFactory]:
    """``await make_runtime("etcd-tcp")`` → a runtime in that mode, shut down after the test (the
    runtimes of one test share their etcd, or their ``file://`` folder). The local etcd and
    nats-server start only for a mode that uses them (the root conftest.py marks such tests
    ``processes`` by their ``mode`` parameter)."""
    made: list[DistributedRuntime] = []
    folder = f"file://{tmp_path / 'discovery'}"

    async def make(mode: str, **kwargs: object) -> DistributedRuntime:
        discovery, plane = mode.split("-")
        uses_services = discovery == "etcd" or plane == "nats"
        services: LocalServices | None = request.getfixturevalue("services") if uses_services else None
        etcd_url = services.etcd_url if services else None
        spec = {"memory": "memory", "file": folder, "etcd": etcd_url, "static": "static"}[discovery]
        nats_url = services.nats_url if services else None
        runtime = await DistributedRuntime.create(spec, plane, nats_url, **kwargs)  # type: ignore[arg-type]
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        await runtime.shutdown(grace=0.5)


@pytest.fixture
async def start_worker(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[ManagedProcess]]]:
    """``await start_worker(*flags, script=ECHO_WORKER)`` → a ready component (stopped after the test)."""
    started: list[ManagedProcess] = []

    async def start(
        *flags: str, script: Path = ECHO_WORKER, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        worker = await launch(
            script, *flags, cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=timeout, env=env
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.stop(timeout=5)


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


@pytest.fixture(scope="module")
async def frontends() -> AsyncIterator[Any]:
    """The hf engine (the tiny model) in this process behind two frontends: one reading no tool
    calls (``frontends[0]``, also the ``frontend`` fixture), one reading Hermes calls."""
    async with hf_frontends({}, {"tool_call_parser": "hermes"}) as (plain, with_tools):
        yield plain, with_tools


@pytest.fixture
def frontend(frontends: Any) -> Any:
    return frontends[0]
