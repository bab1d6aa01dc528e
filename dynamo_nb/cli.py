"""Command-line flags shared by every component (DESIGN.md §4b): one definition, reused.

Each flag may take its default from a ``DYN_NB_*`` environment variable; a flag given on
the command line always wins, and ``--help`` shows every default.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_runtime_args(parser)
    >>> args = parser.parse_args(["--discovery", "etcd://127.0.0.1:2379"])
    >>> args.discovery, args.request_plane
    ('etcd://127.0.0.1:2379', None)
"""

from __future__ import annotations

import argparse
import os

from .discovery import DEFAULT_LEASE_TTL
from .runtime import DistributedRuntime

__all__ = ["add_endpoint_arg", "add_runtime_args", "runtime_from_args"]


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(f"DYN_NB_{name}", default)


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--discovery``, ``--request-plane``, ``--nats-url``, ``--lease-ttl``, ``--static``."""
    group = parser.add_argument_group("runtime")
    group.add_argument(
        "--discovery",
        default=_env("DISCOVERY", "memory"),
        help="discovery backend: memory | etcd://HOST:PORT | static (env DYN_NB_DISCOVERY; default: %(default)s)",
    )
    group.add_argument(
        "--request-plane",
        choices=("inproc", "tcp", "nats"),
        default=_env("REQUEST_PLANE", None),
        help="request plane (env DYN_NB_REQUEST_PLANE; default: inproc with memory discovery, tcp with etcd, "
        "nats for --static with --nats-url)",
    )
    group.add_argument(
        "--nats-url",
        default=_env("NATS_URL", None),
        help="NATS server, nats://HOST:PORT (env DYN_NB_NATS_URL; default: %(default)s)",
    )
    group.add_argument(
        "--lease-ttl",
        type=float,
        default=float(_env("LEASE_TTL", str(DEFAULT_LEASE_TTL)) or DEFAULT_LEASE_TTL),
        help="seconds after which a dead worker leaves etcd (default: %(default)s)",
    )
    group.add_argument(
        "--static",
        action="store_true",
        help="static mode: no discovery service; serve at the subject derived from the endpoint path (NATS) "
        "or at --tcp-port (same as --discovery static)",
    )
    group.add_argument(
        "--tcp-host",
        default=_env("TCP_HOST", "127.0.0.1"),
        help="TCP plane listen host (default: %(default)s)",
    )
    group.add_argument(
        "--tcp-port",
        type=int,
        default=int(_env("TCP_PORT", "0") or 0),
        help="TCP plane port, 0 = free (default: %(default)s)",
    )


def add_endpoint_arg(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--endpoint ns.comp.ep`` with ``default``."""
    parser.add_argument(
        "--endpoint",
        default=_env("ENDPOINT", default),
        help="endpoint to serve, ns.comp.ep (default: %(default)s)",
    )


async def runtime_from_args(args: argparse.Namespace) -> DistributedRuntime:
    """Create the runtime the flags describe."""
    return await DistributedRuntime.create(
        "static" if args.static else args.discovery,
        args.request_plane,
        args.nats_url,
        lease_ttl=args.lease_ttl,
        tcp_host=args.tcp_host,
        tcp_port=args.tcp_port,
    )
