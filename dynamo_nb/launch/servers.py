"""A server that is not one of the kit's programs (``vllm serve``, SGLang's server, Dynamo's
frontend) started as a background process with `launch`'s log view, ledger and clean stop, and
ready once it answers over HTTP (it prints no READY line).

Example::

    vllm = await launch_server("-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                               "--port", 8001, url="http://127.0.0.1:8001", name="vllm")
    worker = await launch_upstream(vllm, "--model-path", model_dir, "--discovery", "file:///tmp/kv")
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from ..errors import LaunchError
from ..http.lean_client import fetch
from .launcher import ManagedProcess, launch

__all__ = ["launch_server", "launch_upstream", "wait_until_answering"]

UPSTREAM_WORKER = "components/upstream_worker.py"


async def wait_until_answering(
    process: ManagedProcess, url: str, timeout: float, *, what: str = "the server"
) -> None:
    """Until ``GET url`` answers 200 (checked every 0.1 s, from the host ``process`` runs on),
    ``process`` exits (`LaunchError` with its last lines) or ``timeout`` seconds pass
    (`LaunchError` too; the process is left running)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    socket_factory = process.host.socket if process.host is not None else None
    while True:
        try:
            if (await fetch(url, timeout=5, socket_factory=socket_factory))[0] == 200:
                return
        except (ConnectionError, TimeoutError):
            pass
        if process.returncode is not None:
            raise process.start_error(f"{what} exited with {process.returncode}", process.returncode)
        if loop.time() >= deadline:
            raise process.start_error(f"{what} did not answer at {url} within {timeout:g} s", None)
        await asyncio.sleep(0.1)


async def launch_server(
    program: str | os.PathLike[str],
    *args: Any,
    url: str,
    ready_path: str = "/v1/models",
    timeout: float = 300.0,
    **launch_options: Any,
) -> ManagedProcess:
    """Start ``program *args`` (``"-m", "module"`` runs a module on this Python) and return once
    ``GET url + ready_path`` answers 200; its ``url`` is ``url``. A server that exits first, or
    does not answer within ``timeout`` seconds, is stopped and a `LaunchError` says so with its
    last log lines. ``launch_options`` go to `launch` (``name``, ``env``, ``log_dir`` …).

    Example::

        server = await launch_server("-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                                     "--port", 8001, url="http://127.0.0.1:8001")
    """
    if str(program) == "-m":
        program, args = sys.executable, ("-m", *args)
    base = url.rstrip("/")
    process = await launch(program, *args, ready=None, timeout=timeout, **launch_options)
    try:
        await wait_until_answering(process, base + ready_path, timeout, what=process.name)
    except BaseException:
        await process.stop(timeout=10)
        raise
    process.url = base
    return process


async def launch_upstream(server: ManagedProcess | str, *flags: Any, **launch_options: Any) -> ManagedProcess:
    """Start an upstream worker (components/upstream_worker.py) in front of ``server`` (a
    `launch_server` process, or its URL), with its ``flags`` (``--discovery``, ``--model-path``,
    ``--upstream-kv-events`` …); returns once it serves (its READY line)."""
    url = server if isinstance(server, str) else server.url
    if url is None:
        raise LaunchError(f"{server!r} has no URL: start it with launch_server(..., url=)")
    return await launch(UPSTREAM_WORKER, "--upstream", url, *flags, **launch_options)
