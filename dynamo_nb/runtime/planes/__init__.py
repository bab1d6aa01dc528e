"""Request planes: how a request reaches a worker and its stream comes back.

- ``base.py``: `RequestPlane`, what every request plane provides, and the heartbeat interval;
- ``inproc.py`` (same process), ``tcp.py`` (the worker listens; msgpack frames, many streams per
  connection) and ``nats.py`` (a subject per instance): the request planes;
- ``wire.py``: the frames they share (msgpack, sizes bounded); nothing is pickled;
- ``channel.py``: the caller's side of one stream, its frames in order;
- ``event_plane.py``: the event plane, fire-and-forget messages (an in-process bus, or NATS pub/sub).
"""

from __future__ import annotations

from ...errors import ConfigError
from ..security import PlaneSecurity
from .base import HEARTBEAT_INTERVAL, RequestPlane, StreamHandle
from .inproc import InprocPlane
from .nats import NatsPlane
from .tcp import TcpPlane

__all__ = [
    "HEARTBEAT_INTERVAL",
    "InprocPlane",
    "NatsPlane",
    "RequestPlane",
    "StreamHandle",
    "TcpPlane",
    "make_plane",
]

PLANES = ("inproc", "tcp", "nats")


def make_plane(
    name: str,
    *,
    nats_url: str | None = None,
    tcp_host: str = "127.0.0.1",
    tcp_port: int = 0,
    tcp_advertise_host: str | None = None,
    heartbeat_timeout: float = 5.0,
    connect_timeout: float = 5.0,
    security: PlaneSecurity | None = None,
) -> RequestPlane:
    """Build the request plane called ``name``.

    Example:
        >>> make_plane("inproc").name
        'inproc'
    """
    if heartbeat_timeout <= 2 * HEARTBEAT_INTERVAL:
        raise ConfigError(
            f"heartbeat_timeout must be more than {2 * HEARTBEAT_INTERVAL:g} s (workers send a heartbeat every "
            f"{HEARTBEAT_INTERVAL:g} s), got {heartbeat_timeout}"
        )
    if name == "inproc":
        return InprocPlane(heartbeat_timeout=heartbeat_timeout)
    if name == "tcp":
        return TcpPlane(
            host=tcp_host,
            port=tcp_port,
            heartbeat_timeout=heartbeat_timeout,
            advertise_host=tcp_advertise_host,
            security=security,
        )
    if name == "nats":
        if not nats_url:
            raise ConfigError(
                "request_plane='nats' needs nats_url='nats://HOST:PORT' (e.g. services.nats_url from LocalServices)"
            )
        return NatsPlane(nats_url, heartbeat_timeout=heartbeat_timeout, connect_timeout=connect_timeout)
    raise ConfigError(f"unknown request plane {name!r}: use one of {', '.join(PLANES)}")
