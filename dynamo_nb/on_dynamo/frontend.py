"""NVIDIA Dynamo's own frontend (``python -m dynamo.frontend``) started from Python, set up for
the same discovery as the kit's programs on ``--runtime dynamo``.

Example::

    frontend = await launch_dynamo_frontend("file:///tmp/kv")      # in a notebook cell, or a script
    print(frontend.url)                                            # http://127.0.0.1:PORT
    await frontend.process.stop()
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import DynamoNBError
from ..extras import require_extra
from ..launch.launcher import ManagedProcess
from ..launch.network_host import NetworkHost
from ..launch.servers import launch_server
from ..runtime.addresses import free_port
from .planes import LOOPBACK, DynamoPlanes

__all__ = ["DynamoFrontend", "launch_dynamo_frontend", "main"]


@dataclass
class DynamoFrontend:
    """A running ``python -m dynamo.frontend``: its process and its base URL."""

    process: ManagedProcess
    url: str

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM it (then SIGKILL after ``timeout`` s); its exit status (None: it was not ours to stop)."""
        return await self.process.stop(timeout=timeout)


async def launch_dynamo_frontend(
    discovery: str,
    *args: str,
    port: int | None = None,
    nats_url: str | None = None,
    request_plane: str | None = None,
    host: str = LOOPBACK,
    allow_unauthenticated: bool = False,
    network_host: NetworkHost | None = None,
    **launch_options: Any,
) -> DynamoFrontend:
    """Start Dynamo's frontend on ``host``:``port`` (127.0.0.1 and a free port by default) over
    ``discovery`` (``file://DIR`` or ``etcd://HOST:PORT``, as given to the workers'
    ``--discovery``); ``args`` are its own flags (``--router-mode kv`` …); ``network_host``: the
    `NetworkHost` to run it on (``host`` is then that host's address); ``launch_options`` go to
    `dynamo_nb.launch`.

    Workers on other hosts stream their answers back to a server of the frontend's on ``host``
    too, which has no secret: off loopback it needs ``allow_unauthenticated`` (as the workers'
    ``--allow-unauthenticated``).

    Raises:
        ConfigError: ``host`` is off loopback without ``allow_unauthenticated``.
    """
    require_extra("dynamo", "Dynamo's frontend")
    planes = DynamoPlanes.from_flags(
        discovery, request_plane, nats_url, tcp_host=host, allow_unauthenticated=allow_unauthenticated
    )
    planes.check_listeners("host=")
    port = port or free_port()
    env = {**planes.frontend_environment(host), "DYN_LOG": launch_options.pop("log", "info")}
    env.update(launch_options.pop("env", None) or {})
    timeout = float(launch_options.pop("timeout", 120.0))
    url = f"http://{host}:{port}"
    process = await launch_server(  # its log may be quieter than a READY line: asked over HTTP
        *DynamoPlanes.frontend_argv(port, host),
        *args,
        url=url,
        name=launch_options.pop("name", "dynamo-frontend"),
        env=env,
        timeout=timeout,
        host=network_host,
        **launch_options,
    )
    return DynamoFrontend(process, url)


def main(argv: list[str] | None = None) -> int:
    """``python -m dynamo_nb dynamo-frontend --discovery URL [--nats-url URL] [--request-plane P]
    [--http-port N] [DYNAMO'S OWN FLAGS …]``: Dynamo's frontend in this terminal, its environment
    set for workers started with the same ``--runtime dynamo`` flags (the process becomes
    ``python -m dynamo.frontend``: Ctrl-C stops it). Flags it does not know go to Dynamo's
    frontend (``--router-mode kv`` …).

    Example::

        python -m dynamo_nb dynamo-frontend --discovery file:///tmp/kv --router-mode kv
    """
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb dynamo-frontend",
        description="NVIDIA Dynamo's frontend (python -m dynamo.frontend) for the kit's --runtime dynamo "
        "workers; flags not listed here go to it",
    )
    parser.add_argument(
        "--discovery", required=True, help="as the workers' --discovery: file://DIR or etcd://HOST:PORT"
    )
    parser.add_argument("--nats-url", default=None, help="as the workers' --nats-url (NATS event plane)")
    parser.add_argument("--request-plane", default=None, choices=("tcp", "nats"), help="as the workers'")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (default: %(default)s)")
    parser.add_argument(
        "--http-host",
        default=LOOPBACK,
        help="the address it listens on, HTTP and the server workers stream answers back to "
        "(default: %(default)s; off loopback only with --allow-unauthenticated)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen off loopback although Dynamo's planes have no secret (a network you trust)",
    )
    args, theirs = parser.parse_known_args(argv)
    try:
        require_extra("dynamo", "Dynamo's frontend")
        planes = DynamoPlanes.from_flags(
            args.discovery, args.request_plane, args.nats_url, tcp_host=args.http_host,
            allow_unauthenticated=args.allow_unauthenticated,
        )  # fmt: skip
        planes.check_listeners("--http-host")
    except DynamoNBError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = DynamoPlanes.frontend_argv(args.http_port, args.http_host)
    print(
        f"Dynamo's frontend on http://{args.http_host}:{args.http_port} ({planes.describe()})",
        file=sys.stderr,
    )
    environment = {**os.environ, **planes.frontend_environment(args.http_host)}
    os.execve(sys.executable, [*command, *theirs], environment)
