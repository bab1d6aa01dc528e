"""Static mode: no discovery service. Endpoints live at a fixed NATS subject or a given TCP address."""

from __future__ import annotations

from ...errors import ConfigError
from ..ids import new_instance_id, stable_id
from ..instance import Instance
from ..names import EndpointPath
from .base import Discovery, InstanceSet

__all__ = ["StaticDiscovery", "static_instance"]


def static_instance(path: EndpointPath, transport: dict[str, str]) -> Instance:
    """The fixed pseudo-instance of a static endpoint (its id is derived from path and address)."""
    iid = stable_id(str(path), transport.get("kind", ""), transport.get("address", ""))
    return Instance(path.namespace, path.component, path.endpoint, iid, transport)


class StaticDiscovery(Discovery):
    """No etcd: servers register nothing; clients are told where the endpoint is.

    With the NATS plane an endpoint is served at the subject derived from its path (several
    static workers share it as a queue group). With the TCP plane the client names the
    address: ``await endpoint.client(address="tcp://HOST:PORT")``.
    """

    kind = "static"

    def __init__(self) -> None:
        super().__init__()
        self._static_transports: dict[EndpointPath, list[dict[str, str]]] = {}

    async def start(self) -> None:
        self.connection_id = new_instance_id()

    async def close(self) -> None:
        return None

    async def register_instance(self, instance: Instance) -> None:
        return None

    async def deregister_instance(self, instance: Instance) -> None:
        return None

    def set_transports(self, path: EndpointPath, transports: list[dict[str, str]]) -> None:
        """Where clients of ``path`` send requests (set by the runtime from the plane and address)."""
        self._static_transports[path] = transports
        self._instance_sets.pop(path, None)

    async def _new_instance_set(self, path: EndpointPath) -> InstanceSet:
        transports = self._static_transports.get(path)
        if not transports:
            raise ConfigError(
                f"static discovery does not know where {path} is served: with request_plane='tcp' pass "
                "`address='tcp://HOST:PORT'` to endpoint.client(); with request_plane='nats' the subject "
                "is derived from the path"
            )
        instance_set = InstanceSet(path, static=True)
        for transport in transports:
            instance_set.put(static_instance(path, transport))
        return instance_set
