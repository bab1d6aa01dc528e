"""`DistributedRuntime` and the namespace → component → endpoint hierarchy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..errors import ConfigError, RuntimeClosedError
from .addresses import LOOPBACK, AddressRule
from .client import Client
from .discovery import DEFAULT_LEASE_TTL, Discovery, KeyValueDiscovery, StaticDiscovery, make_discovery
from .discovery.static import static_instance
from .ids import new_instance_id
from .instance import Instance
from .names import EndpointPath, validate_name
from .planes import RequestPlane, make_plane
from .planes.event_plane import EventPlane, event_subject, make_event_plane
from .planes.nats import static_subject
from .planes.tcp import parse_tcp_address
from .security import PlaneSecurity
from .server import STOP_GRACE_SECONDS, EndpointServer, Handler

__all__ = ["Component", "DistributedRuntime", "Endpoint", "Namespace"]

logger = logging.getLogger("dynamo_nb.runtime")


def _default_plane(discovery: str, nats_url: str | None) -> str:
    if discovery == "memory":
        return "inproc"
    if discovery == "static" and nats_url:
        return "nats"
    return "tcp"


class DistributedRuntime:
    """One process's (or one notebook's) connection to discovery and the request plane.

    Create it with `create`; it owns every server and client made from it and releases them
    on `shutdown` (also at the end of ``async with``).

    Example:
        >>> rt = await DistributedRuntime.create()          # memory discovery, inproc plane
        >>> ep = rt.namespace("demo").component("echo").endpoint("generate")
        >>> await rt.shutdown()

    Across processes::

        rt = await DistributedRuntime.create(discovery="etcd://127.0.0.1:2379", request_plane="tcp")
    """

    def __init__(self, discovery: Discovery, plane: RequestPlane) -> None:
        """Use `DistributedRuntime.create`."""
        self.discovery = discovery
        self.request_plane = plane
        self._servers: list[EndpointServer] = []
        self._used_ids: set[tuple[EndpointPath, int]] = set()
        self._instance_keys: dict[int, list[str]] = {}  # id(server) → keys that leave with it
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._closed = asyncio.Event()
        self._nats_url: str | None = None
        self._connect_timeout = 5.0
        self._events: EventPlane | None = None
        self.addresses = AddressRule()
        """Where this process's servers listen and what they advertise (`AddressRule`)."""
        self.listen_host: str | None = None
        """The host the TCP plane listens on, the default of this process's other servers (None:
        no TCP host was asked for: theirs follow `addresses`)."""
        self.advertise_host: str | None = None
        """The host the TCP plane advertises, the default of this process's other servers."""

    @classmethod
    async def create(
        cls,
        discovery: str = "memory",
        request_plane: str | None = None,
        nats_url: str | None = None,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        tcp_host: str | None = None,
        tcp_port: int = 0,
        tcp_advertise_host: str | None = None,
        heartbeat_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        security: PlaneSecurity | None = None,
    ) -> DistributedRuntime:
        """Connect to discovery and the request plane.

        Args:
            discovery: ``"memory"`` (one process), ``"etcd://HOST:PORT"`` or ``"static"`` (no discovery).
            request_plane: ``"inproc"``, ``"tcp"`` or ``"nats"``; default inproc with memory
                discovery, tcp with etcd, nats for static when ``nats_url`` is given, else tcp.
            nats_url: ``nats://HOST:PORT``, needed by the nats plane.
            lease_ttl: seconds after which a dead worker's keys leave etcd.
            tcp_host, tcp_port: where this runtime's TCP plane listens (0: a free port); by
                default loopback when discovery and NATS are on this machine, else the address
                that reaches them (`dynamo_nb.runtime.addresses`).
            tcp_advertise_host: the host discovery gives clients (default: ``tcp_host``, or for
                a wildcard ``tcp_host`` the address that reaches discovery; never a wildcard).
            heartbeat_timeout: seconds of silence after which a stream counts as cut.
            connect_timeout: seconds to keep trying etcd and NATS until they answer (`dynamo_nb.runtime.startup`).
            security: the cluster secret and TLS files the TCP plane requires of its peers
                (default: `dynamo_nb.runtime.security.current_security`, from the environment).

        Raises:
            ConfigError: an impossible combination, with what to change.
            ServiceUnavailableError: etcd or NATS did not answer.
        """
        plane_name = request_plane or _default_plane(discovery, nats_url)
        if plane_name == "inproc" and discovery != "memory":
            raise ConfigError(
                f"request_plane='inproc' only reaches servers in this process, so it needs discovery='memory' "
                f"(got {discovery!r}); use request_plane='tcp' or 'nats' across processes"
            )
        disc = make_discovery(discovery, lease_ttl=lease_ttl, connect_timeout=connect_timeout)
        addresses = AddressRule.toward([discovery, nats_url])
        listen: str | None = None
        advertise: str | None = None
        if plane_name == "tcp" or tcp_host is not None or tcp_advertise_host is not None:
            await addresses.resolve()
            listen = addresses.listen(tcp_host)
            advertise = addresses.advertise(listen, tcp_advertise_host, what="the TCP request plane")
        plane = make_plane(
            plane_name,
            nats_url=nats_url,
            tcp_host=listen or LOOPBACK,
            tcp_port=tcp_port,
            tcp_advertise_host=advertise,
            heartbeat_timeout=heartbeat_timeout,
            connect_timeout=connect_timeout,
            security=security,
        )
        await disc.start()
        try:
            await plane.start()
        except BaseException:
            await disc.close()
            raise
        runtime = cls(disc, plane)
        runtime._nats_url, runtime._connect_timeout = nats_url, connect_timeout
        runtime.addresses = addresses
        runtime.listen_host, runtime.advertise_host = listen, advertise
        logger.info("runtime %x up: discovery=%s plane=%s", disc.connection_id, disc.describe(), plane.name)
        return runtime

    # -- hierarchy

    def namespace(self, name: str) -> Namespace:
        """The namespace ``name`` (lowercase letters, digits, ``-``, ``_``)."""
        return Namespace(self, name)

    def endpoint(self, path: str) -> Endpoint:
        """The endpoint at ``"ns.comp.ep"`` or ``"dyn://ns.comp.ep"``."""
        return Endpoint(self, EndpointPath.parse(path))

    # -- state

    @property
    def connection_id(self) -> int:
        """This runtime's id; with etcd its lease id. The first instance of each endpoint uses it."""
        return self.discovery.connection_id

    @property
    def is_static(self) -> bool:
        return isinstance(self.discovery, StaticDiscovery)

    @property
    def nats_url(self) -> str | None:
        """The NATS server it was given (its event plane crosses processes), else None."""
        return self._nats_url

    @property
    def servers(self) -> list[EndpointServer]:
        """The endpoints this runtime serves now."""
        return list(self._servers)

    @property
    def is_shutdown(self) -> bool:
        return self._closing

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task owned by the runtime (cancelled at shutdown)."""
        self._check_open()
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _check_open(self) -> None:
        if self._closing:
            raise RuntimeClosedError(
                "this runtime was shut down; create a new one with DistributedRuntime.create()"
            )

    # -- serving

    async def _serve(
        self, endpoint: Endpoint, handler: Handler, stop_grace: float = STOP_GRACE_SECONDS
    ) -> EndpointServer:
        self._check_open()
        path = endpoint.path
        static = self.is_static
        instance_id = self.connection_id
        if (path, instance_id) in self._used_ids:
            instance_id = new_instance_id()
        target = str(path) if static else f"{path}/{instance_id:x}"
        # EndpointServer checks the handler: a bad one fails here, before anything is registered.
        server = EndpointServer(
            endpoint,
            handler,
            Instance(path.namespace, path.component, path.endpoint, instance_id),
            stop_grace,
        )
        transport = await self.request_plane.add_target(target, server, static=static)
        server.instance = (
            static_instance(path, transport)
            if static
            else Instance(path.namespace, path.component, path.endpoint, instance_id, transport)
        )
        try:
            await self.discovery.register_instance(server.instance)
        except BaseException:
            await self.request_plane.remove_target(target)
            raise
        self._used_ids.add((path, instance_id))
        self._servers.append(server)
        logger.info("serving %s as instance %x at %s", path, server.instance_id, server.address)
        return server

    async def put_instance_key(self, server: EndpointServer, key: str, value: bytes) -> None:
        """Write ``key`` in discovery for as long as ``server``'s instance lives (e.g. a model card).

        The key is deleted when the server stops; with etcd it also hangs on this runtime's
        lease, so it disappears when the process dies.
        """
        self._check_open()
        if not isinstance(self.discovery, KeyValueDiscovery):
            raise ConfigError(f"discovery {self.discovery.kind!r} stores no keys; use memory or etcd")
        await self.discovery.put(key, value)
        self._instance_keys.setdefault(id(server), []).append(key)

    async def delete_instance_key(self, server: EndpointServer, key: str) -> None:
        """Delete a key `put_instance_key` wrote for ``server`` before the instance stops."""
        keys = self._instance_keys.get(id(server), [])
        if key in keys:
            keys.remove(key)
            await self.discovery.delete(key)  # type: ignore[attr-defined]  # every discovery backend has delete; the base protocol names only what routers read

    async def _withdraw(self, server: EndpointServer) -> None:
        """``server``'s instance out of discovery (its target still served: streams finish)."""
        await self.discovery.deregister_instance(server.instance)
        logger.info("instance %x of %s left discovery for now", server.instance_id, server.endpoint.path)

    async def _rejoin(self, server: EndpointServer) -> None:
        await self.discovery.register_instance(server.instance)
        logger.info("instance %x of %s is back in discovery", server.instance_id, server.endpoint.path)

    async def _unserve(self, server: EndpointServer) -> None:
        if server in self._servers:
            self._servers.remove(server)
        try:
            for key in self._instance_keys.pop(id(server), []):
                await self.discovery.delete(key)  # type: ignore[attr-defined]  # every discovery backend has delete; the base protocol names only what routers read
            await self.discovery.deregister_instance(server.instance)
        except Exception as exc:  # discovery gone: the lease expires on its own
            logger.warning("could not deregister %s: %s", server.instance.describe(), exc)
        await self.request_plane.remove_target(server.instance.target)
        self._used_ids.discard((server.endpoint.path, server.instance_id))

    async def _client(self, endpoint: Endpoint, address: str | list[str] | None) -> Client:
        self._check_open()
        if isinstance(self.discovery, StaticDiscovery):
            self.discovery.set_transports(endpoint.path, self._static_transports(endpoint.path, address))
        elif address is not None:
            raise ConfigError(
                "address= is only for discovery='static'; with memory or etcd discovery the client finds "
                "instances itself"
            )
        instances = await self.discovery.instance_set(endpoint.path)
        return Client(endpoint, instances, self.request_plane, self.discovery.describe())

    def _static_transports(self, path: EndpointPath, address: str | list[str] | None) -> list[dict[str, str]]:
        plane = self.request_plane.name
        if plane == "nats":
            if address is not None:
                raise ConfigError(
                    "static endpoints on NATS live at the subject derived from their path; drop address="
                )
            return [{"kind": "nats", "address": static_subject(path), "target": str(path)}]
        if address is None:
            raise ConfigError(
                f"static discovery with request_plane={plane!r} needs the worker's address: "
                "endpoint.client(address='tcp://HOST:PORT') (the worker prints it, see server.address)"
            )
        addresses = [address] if isinstance(address, str) else list(address)
        out = []
        for item in addresses:
            host, port = parse_tcp_address(item)
            out.append({"kind": "tcp", "address": f"{host}:{port}", "target": str(path)})
        return out

    async def events(self) -> EventPlane:
        """The event plane (in-process with memory discovery, NATS when ``nats_url`` was given).

        Raises:
            ConfigError: etcd or static discovery without ``nats_url``: events could not cross processes.
        """
        self._check_open()
        if self._events is None:
            self._events = make_event_plane(self.discovery.kind, self._nats_url, self._connect_timeout)
        return self._events

    # -- lifecycle

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop serving (running streams get ``grace`` seconds), leave discovery, close connections."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            await asyncio.gather(*(s.stop(grace) for s in list(self._servers)), return_exceptions=True)
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=2.0)
            await self.request_plane.close()
            if self._events is not None:
                await self._events.close()
            await self.discovery.close()
        finally:
            self._closed.set()
            logger.info("runtime %x shut down", self.connection_id)

    async def wait_closed(self) -> None:
        """Wait until the runtime has shut down."""
        await self._closed.wait()

    async def __aenter__(self) -> DistributedRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self._closing else f"{len(self._servers)} served"
        return (
            f"<DistributedRuntime id={self.connection_id:x} discovery={self.discovery.describe()} "
            f"plane={self.request_plane.name} {state}>"
        )


class Namespace:
    """A group of components, e.g. one deployment (``rt.namespace("dynamo")``)."""

    def __init__(self, runtime: DistributedRuntime, name: str) -> None:
        self.runtime = runtime
        self.name = validate_name("namespace", name)

    def component(self, name: str) -> Component:
        """The component ``name`` in this namespace."""
        return Component(self, name)

    def __repr__(self) -> str:
        return f"<Namespace {self.name}>"


class Component:
    """A kind of worker in a namespace, e.g. ``backend`` or ``prefill``."""

    def __init__(self, namespace: Namespace, name: str) -> None:
        self.namespace = namespace
        self.name = validate_name("component", name)

    def endpoint(self, name: str) -> Endpoint:
        """The endpoint ``name`` of this component."""
        return Endpoint(self.namespace.runtime, EndpointPath(self.namespace.name, self.name, name))

    async def publish_event(self, topic: str, payload: dict[str, Any]) -> None:
        """Send ``payload`` (a msgpack-able map) to everyone listening to this component's ``topic``.

        Example::

            await component.publish_event("kv_events", {"event_id": 1})
        """
        plane = await self.namespace.runtime.events()
        await plane.publish(event_subject(self.namespace.name, self.name, topic), payload)

    async def subscribe_events(
        self, topic: str, listener: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]:
        """Call ``listener(payload)`` for each event on this component's ``topic``; returns an unsubscribe."""
        plane = await self.namespace.runtime.events()
        return await plane.subscribe(event_subject(self.namespace.name, self.name, topic), listener)

    def __repr__(self) -> str:
        return f"<Component {self.namespace.name}.{self.name}>"


class Endpoint:
    """An address requests are sent to: ``namespace.component.endpoint``.

    Example:
        >>> import asyncio
        >>> async def generate(request, context):
        ...     for word in request["text"].split():
        ...         yield {"word": word}
        >>> async def main():
        ...     async with await DistributedRuntime.create() as rt:
        ...         endpoint = rt.endpoint("demo.words.generate")
        ...         server = await endpoint.serve(generate)
        ...         client = await endpoint.client()
        ...         return [x async for x in client.round_robin({"text": "a b"})]
        >>> asyncio.run(main())
        [{'word': 'a'}, {'word': 'b'}]
    """

    def __init__(self, runtime: DistributedRuntime, path: EndpointPath) -> None:
        self.runtime = runtime
        self.path = path

    @property
    def name(self) -> str:
        return self.path.endpoint

    @property
    def url(self) -> str:
        return self.path.url

    def component(self) -> Component:
        """The component this endpoint belongs to."""
        return Namespace(self.runtime, self.path.namespace).component(self.path.component)

    async def serve(self, handler: Handler, *, stop_grace: float = STOP_GRACE_SECONDS) -> EndpointServer:
        """Serve ``handler`` in the background; returns once the instance is registered.

        ``handler`` is an async generator ``handler(request)`` or ``handler(request, context)``
        whose each ``yield`` is one JSON-able stream item. A request its caller stops has
        ``context.is_stopped()`` at once, and is cancelled ``stop_grace`` seconds later if the
        handler has not returned by then.
        """
        return await self.runtime._serve(self, handler, stop_grace)

    async def serve_endpoint(
        self,
        handler: Handler,
        graceful_shutdown: bool = True,
        *,
        stop_grace: float = STOP_GRACE_SECONDS,
        on_serving: Callable[[EndpointServer], Awaitable[object]] | None = None,
    ) -> None:
        """Serve ``handler`` until the runtime shuts down (Dynamo semantics).

        With ``graceful_shutdown`` running streams may finish before it returns. ``on_serving``
        is awaited once the instance is registered (e.g. to publish its model card).
        """
        server = await self.serve(handler, stop_grace=stop_grace)
        try:
            if on_serving is not None:
                await on_serving(server)
            await self.runtime.wait_closed()
        finally:
            await server.stop(grace=5.0 if graceful_shutdown else 0.0)

    async def client(self, *, address: str | list[str] | None = None) -> Client:
        """A client of this endpoint. ``address`` (``tcp://HOST:PORT``) is for static TCP endpoints."""
        return await self.runtime._client(self, address)

    def __repr__(self) -> str:
        return f"<Endpoint {self.path.url}>"
