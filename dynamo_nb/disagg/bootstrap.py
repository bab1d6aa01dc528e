"""The bootstrap server of a prefill worker: KV caches parked by room, fetched once by a decode.

A prefill `park`\\ s the KV of its prompt under the request's room and token (or `fail`\\ s
the room, so the decode learns why). A decode calls `fetch_kv`: it connects to
``bootstrap_host:port``, asks for the room with its token and waits — the prefill may not have
finished yet — up to its timeout. A room is handed out once, and only to a caller with its
token (compared in constant time; a wrong one is refused and the room stays for its decode);
rooms nobody fetches (or parks) expire after ``ttl`` seconds, so a decode that never comes
leaks nothing. While the prefill runs, the server tells a waiting decode so every
``KEEPALIVE_S`` seconds; a decode that hears nothing for ``KV_SILENCE_S`` seconds stops waiting (a
prefill worker that hangs, frozen or stuck, costs its decode seconds, not ``--kv-timeout``), while a
slow prefill keeps its decode waiting as long as it is alive. A malformed or oversized request closes that connection only. It listens on
127.0.0.1 unless told otherwise.

Frames on the wire: a 4-byte big-endian length, a JSON header, then (for a KV answer) the
raw payload whose size the header gives. Nothing is pickled.

Example::

    server = await BootstrapServer.start()
    server.park(room, header, payload)
    header, payload = await fetch_kv(BootstrapInfo("127.0.0.1", server.port, room))
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthenticationError, ConfigError, DisaggregationError
from ..runtime.addresses import AddressRule, host_port, is_wildcard
from ..runtime.bounded_decode import json_cost_problem
from ..runtime.planes.base import set_nodelay
from ..runtime.security import (
    BOOTSTRAP,
    ClientHandshake,
    PlaneSecurity,
    ServerHandshake,
    accept_peer,
    current_security,
    introduce_to_peer,
    without_secret_hint,
)
from .rooms import BootstrapInfo

__all__ = ["BootstrapServer", "fetch_kv"]

logger = logging.getLogger("dynamo_nb.disagg")

_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20  # the KV cache's description, from the prefill's server
MAX_ASK_BYTES = 4096  # {"room", "timeout", "token"}, from whoever connects to the server
MAX_PAYLOAD_BYTES = 8 << 30
KEEPALIVE_S = 0.5  # how often a bootstrap server tells a waiting decode that its prefill runs
KV_SILENCE_S = 2.0  # a decode that hears nothing from the server this long stops waiting


async def _write_frame(writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes = b"") -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    writer.write(_LENGTH.pack(len(data)) + data)
    if payload:
        writer.write(payload)
    await writer.drain()


async def _read_header(reader: asyncio.StreamReader, max_bytes: int = MAX_HEADER_BYTES) -> dict[str, Any]:
    prefix = await reader.readexactly(_LENGTH.size)
    (size,) = _LENGTH.unpack(prefix)
    if size > max_bytes:
        hint = without_secret_hint(prefix)
        raise DisaggregationError(
            hint or f"a bootstrap header of {size} bytes is too large (limit {max_bytes})"
        )
    raw = await reader.readexactly(size)
    problem = json_cost_problem(raw)
    if problem is not None:
        raise DisaggregationError(f"a bootstrap header was refused: {problem}")
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise DisaggregationError("a bootstrap header must be a JSON object")
    return header


@dataclass
class _Room:
    created: float
    ready: asyncio.Future[tuple[dict[str, Any], bytes] | str] = field(default_factory=asyncio.Future)
    token: str | None = None  # set by park/fail: who may fetch it


def _token_matches(expected: str | None, presented: Any) -> bool:
    """Whether ``presented`` is the room's token (constant time; a room without one takes any)."""
    if expected is None:
        return True
    return isinstance(presented, str) and hmac.compare_digest(expected.encode(), presented.encode())


class BootstrapServer:
    """Parks KV caches by room until their decode fetches them. Start it with `BootstrapServer.start`.

    Attributes:
        host, port: where decode workers reach it (its advertised host, the port it listens
            on): the worker's ``disaggregated_endpoint``.
        expired_total: rooms dropped because nobody fetched (or parked) them within ``ttl``.
        served_total: KV caches handed to a decode.
    """

    def __init__(self, ttl: float, security: PlaneSecurity | None = None) -> None:
        """Use `BootstrapServer.start`."""
        self.ttl = ttl
        self.security = security if security is not None else current_security()
        self.host = ""
        self.port = 0
        self.expired_total = 0
        self.served_total = 0
        self._rooms: dict[int, _Room] = {}
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    @classmethod
    async def start(
        cls,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ttl: float = 60.0,
        advertise_host: str | None = None,
        security: PlaneSecurity | None = None,
    ) -> BootstrapServer:
        """Listen on ``host:port`` (0: a free port); rooms expire ``ttl`` seconds after they appear.
        ``advertise_host`` is the host decode workers are told: by default the address it listens
        on, or for a wildcard ``host`` this host's loopback (a worker passes the address other
        hosts reach: `dynamo_nb.disagg.modes.WorkerRole`). ``security``: the cluster secret and
        TLS files a decode must present (default: `dynamo_nb.runtime.security.current_security`)."""
        if advertise_host is not None and is_wildcard(advertise_host):
            raise ConfigError(
                f"cannot advertise {advertise_host!r} for a bootstrap server: give a reachable address"
            )
        server = cls(ttl, security)
        server.security.check_listener(host, "the bootstrap server")
        server._server = await asyncio.start_server(
            server._serve, host, port, ssl=server.security.server_ssl()
        )
        bound, server.port = server._server.sockets[0].getsockname()[:2]
        server.host = advertise_host or (
            AddressRule().advertise(host, what=None) if is_wildcard(host) else bound
        )
        server._sweeper = asyncio.get_running_loop().create_task(
            server._sweep(), name="dynamo_nb-bootstrap-expiry"
        )
        return server

    @property
    def endpoint(self) -> dict[str, Any]:
        """``{"bootstrap_host", "bootstrap_port"}``: the runtime config's ``disaggregated_endpoint``."""
        return {"bootstrap_host": self.host, "bootstrap_port": self.port}

    @property
    def parked(self) -> int:
        """Rooms holding a KV cache (or a failure) that no decode has fetched yet."""
        return sum(1 for room in self._rooms.values() if room.ready.done())

    @property
    def rooms(self) -> int:
        """Rooms held now: parked, failed, or awaited by a decode whose prefill has not parked yet."""
        return len(self._rooms)

    def _room(self, room: int) -> _Room:
        entry = self._rooms.get(room)
        if entry is None:
            entry = self._rooms[room] = _Room(time.monotonic())
        return entry

    def park(self, room: int, header: dict[str, Any], payload: bytes, token: str | None = None) -> None:
        """Hold ``header`` and ``payload`` for the decode that asks for ``room`` with ``token``
        (None: any caller, for engines whose bootstrap has no tokens)."""
        entry = self._room(room)
        if entry.ready.done():
            raise DisaggregationError(f"bootstrap room {room} is already in use: draw rooms at random")
        entry.token = token
        entry.ready.set_result((header, payload))

    def fail(self, room: int, message: str, token: str | None = None) -> None:
        """Tell the decode of ``room`` (with ``token``) that its prefill failed (``message`` says why)."""
        entry = self._room(room)
        if not entry.ready.done():
            entry.token = token
            entry.ready.set_result(f"the prefill failed: {message}")

    def discard(self, room: int) -> None:
        """Drop ``room`` now (its request was cancelled): a decode waiting on it learns so."""
        entry = self._rooms.pop(room, None)
        if entry is not None and not entry.ready.done():
            entry.ready.set_result("the request was cancelled")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        set_nodelay(writer.transport)
        try:
            if self.security.secret is not None:
                try:
                    handshake = ServerHandshake(
                        self.security.secret, BOOTSTRAP, host_port(self.host, self.port)
                    )
                    await accept_peer(reader, writer, handshake)
                except AuthenticationError as exc:
                    logger.warning(
                        "refused a bootstrap connection from %s: %s", writer.get_extra_info("peername"), exc
                    )
                    return
            request = await asyncio.wait_for(_read_header(reader, MAX_ASK_BYTES), 10.0)
            room, wait = request.get("room"), request.get("timeout", 30.0)
            if not isinstance(room, int) or not isinstance(wait, (int, float)):
                await _write_frame(
                    writer, {"ok": False, "error": "ask for {'room': int, 'timeout': seconds}"}
                )
                return
            entry = self._room(room)
            result = await self._wait_for(entry, wait, request.get("keepalive") is True, writer)
            if result is None:
                await _write_frame(
                    writer,
                    {
                        "ok": False,
                        "error": f"no KV cache for room {room} within {wait:g} s: the prefill did not finish",
                    },
                )
                return
            if not _token_matches(entry.token, request.get("token")):
                logger.warning("refused a fetch of bootstrap room %d without its token", room)
                await _write_frame(
                    writer, {"ok": False, "error": f"room {room}: wrong or missing bootstrap_token"}
                )
                return  # the room stays for the decode that has the token
            self._rooms.pop(room, None)  # handed out once
            if isinstance(result, str):
                await _write_frame(writer, {"ok": False, "error": f"room {room}: {result}"})
                return
            header, payload = result
            await _write_frame(writer, {"ok": True, **header}, payload)
            self.served_total += 1
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.TimeoutError,
            ValueError,
            RecursionError,
            DisaggregationError,
        ) as exc:
            logger.debug("bootstrap connection dropped: %r", exc)
        except asyncio.CancelledError:
            # stop() closes the connections it holds; ending here (not re-raising) keeps asyncio's
            # stream callback from logging the cancellation as an error at every shutdown
            return
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()

    @staticmethod
    async def _wait_for(
        entry: _Room, wait: float, keepalive: bool, writer: asyncio.StreamWriter
    ) -> tuple[dict[str, Any], bytes] | str | None:
        """The room's KV (or why its prefill failed) within ``wait`` seconds, else None; with
        ``keepalive`` the decode hears ``{"waiting": true}`` at once and every `KEEPALIVE_S`."""
        if not keepalive:
            try:
                return await asyncio.wait_for(asyncio.shield(entry.ready), wait)
            except asyncio.TimeoutError:
                return None
        deadline = time.monotonic() + wait
        while True:
            await _write_frame(writer, {"waiting": True})
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                return await asyncio.wait_for(asyncio.shield(entry.ready), min(KEEPALIVE_S, remaining))
            except asyncio.TimeoutError:
                continue

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(self.ttl / 4, 5.0))
            self.expire()

    def expire(self) -> int:
        """Drop rooms older than ``ttl`` now (the sweeper does it every ``ttl/4`` s); how many went."""
        cutoff = time.monotonic() - self.ttl
        old = [room for room, entry in self._rooms.items() if entry.created < cutoff]
        for room in old:
            entry = self._rooms.pop(room)
            if not entry.ready.done():  # a decode still waiting learns why
                entry.ready.set_result(f"expired after {self.ttl:g} s without a KV cache")
        if old:
            self.expired_total += len(old)
            logger.info("dropped %d bootstrap room(s) nobody fetched within %g s", len(old), self.ttl)
        return len(old)

    async def stop(self) -> None:
        """Stop listening, drop every room, close the connections."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:  # asyncio.wait, not gather: a gather cut short leaves an unread CancelledError
            await asyncio.wait(list(self._connections), timeout=2.0)
        self._rooms.clear()

    def __repr__(self) -> str:
        return f"<BootstrapServer {self.host}:{self.port} parked={self.parked}>"


async def fetch_kv(
    info: BootstrapInfo,
    timeout: float = 30.0,
    security: PlaneSecurity | None = None,
    silence: float = KV_SILENCE_S,
) -> tuple[dict[str, Any], bytes]:
    """The KV header and payload parked under ``info.room`` (waits up to ``timeout`` for the
    prefill, as long as the server says every `KEEPALIVE_S` that it runs: ``silence`` seconds
    without a word end the wait).

    Raises:
        DisaggregationError: unreachable server, timeout, a silent server (its worker hangs), a
            failed prefill, or a bad answer.
    """
    where = f"bootstrap server {info.host}:{info.port}"
    security = security if security is not None else current_security()
    tls = security.client_ssl()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                info.host, info.port, ssl=tls, server_hostname=info.host if tls else None
            ),
            5.0,
        )
    except (OSError, asyncio.TimeoutError) as exc:
        raise DisaggregationError(f"cannot reach the {where}: {exc!r}") from None
    set_nodelay(writer.transport)
    try:
        if security.secret is not None:
            try:
                handshake = ClientHandshake(security.secret, BOOTSTRAP, host_port(info.host, info.port))
                await introduce_to_peer(reader, writer, handshake, timeout=5.0)
            except AuthenticationError as exc:
                raise DisaggregationError(f"{where}: {exc}") from None
            except asyncio.TimeoutError:
                raise DisaggregationError(
                    f"{where} did not start the cluster-secret handshake: it runs without the secret"
                ) from None
        ask: dict[str, Any] = {"room": info.room, "timeout": timeout, "keepalive": True}
        if info.token is not None:
            ask["token"] = info.token
        await _write_frame(writer, ask)
        deadline = time.monotonic() + timeout + 5.0
        while True:
            try:
                header = await asyncio.wait_for(
                    _read_header(reader), min(silence, max(deadline - time.monotonic(), 0.0))
                )
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                raise DisaggregationError(
                    f"{where} sent nothing for {silence:g} s while this decode waited for room {info.room}: "
                    "its prefill worker seems to hang"
                ) from None
            if header.get("waiting") is not True:
                break
        if not header.pop("ok", False):
            raise DisaggregationError(f"{where}: {header.get('error', 'refused')}")
        size = header.get("payload_bytes")
        if not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD_BYTES:
            raise DisaggregationError(f"{where} sent a KV header without a valid payload_bytes: {size!r}")
        payload = await asyncio.wait_for(reader.readexactly(size), timeout + 5.0)
        return header, payload
    except asyncio.TimeoutError:
        raise DisaggregationError(
            f"{where} did not answer for room {info.room} within {timeout + 5:g} s"
        ) from None
    except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
        raise DisaggregationError(f"{where} closed the connection for room {info.room}: {exc!r}") from None
    finally:
        writer.close()
