"""etcd discovery (aetcd): one lease per runtime, kept alive by a task; watches drive instance lists."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any
from urllib.parse import unquote, urlsplit

import aetcd
import aetcd.rtypes

from ...errors import ConfigError, ServiceUnavailableError
from ..security import redact_url
from ..startup import wait_for_service
from .base import KeyValueDiscovery, PrefixWatch, cancel_tasks

__all__ = ["EtcdDiscovery", "parse_etcd_url"]

logger = logging.getLogger("dynamo_nb.discovery.etcd")

DEFAULT_LEASE_TTL = 10.0
_RPC_TIMEOUT = 5
# gRPC's default reconnect backoff grows to 120 s: after an etcd restart the client would stay
# away longer than a lease lives. Reconnect within a second instead. Each attempt may take up to
# 5 s ("min reconnect backoff" is gRPC's minimum connect timeout): across a lossy network a
# lost handshake packet is resent after 200 ms to 1 s, and a shorter deadline would abort it.
# An etcd host that vanished without a reset (a partition) leaves a connection that looks open:
# while a watch runs, HTTP/2 pings every 10 s (twice etcd's minimum interval, so jitter never
# makes one too early) that go unanswered for 5 s close it: the watches resync and the lease
# keep-alive reconnects once etcd answers.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 5000,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10000,
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.keepalive_permit_without_calls": 0,  # etcd refuses pings on an idle connection
    "grpc.http2.max_pings_without_data": 0,
}
_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0)
_OUTAGE_RETRY_SECONDS = 0.5  # the lease keep-alive's pace while etcd is away


def parse_etcd_url(url: str) -> tuple[str, int]:
    """``etcd://HOST:PORT`` (or ``etcd://USER:PASSWORD@HOST:PORT``) → (host, port).

    Example:
        >>> parse_etcd_url("etcd://127.0.0.1:2379")
        ('127.0.0.1', 2379)
    """
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.hostname:
        raise ConfigError(
            f"invalid etcd discovery URL {redact_url(url)!r}: expected 'etcd://HOST:PORT' "
            "(or etcd://USER:PASSWORD@HOST:PORT), e.g. etcd://127.0.0.1:2379"
        )
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise ConfigError(f"invalid port in etcd discovery URL {redact_url(url)!r}: {exc}") from None
    return parts.hostname, port


def etcd_credentials(url: str) -> tuple[str | None, str | None]:
    """(user, password) for etcd's authentication: the URL's, else ``$DYN_NB_ETCD_USERNAME`` and
    ``$DYN_NB_ETCD_PASSWORD`` (for a Kubernetes Secret), else (None, None).

    Example:
        >>> etcd_credentials("etcd://app:s3cret@etcd:2379")
        ('app', 's3cret')
    """
    parts = urlsplit(url)
    if parts.username:
        return unquote(parts.username), unquote(parts.password or "")
    return os.environ.get("DYN_NB_ETCD_USERNAME") or None, os.environ.get("DYN_NB_ETCD_PASSWORD") or None


class EtcdDiscovery(KeyValueDiscovery):
    """Discovery through etcd. Every key this runtime writes hangs on its one lease.

    A worker that dies stops renewing the lease; etcd then deletes its keys after
    ``lease_ttl`` seconds and every watching client drops the instance.
    """

    kind = "etcd"

    def __init__(
        self, url: str, *, lease_ttl: float = DEFAULT_LEASE_TTL, connect_timeout: float = 5.0
    ) -> None:
        super().__init__()
        self.url = url
        self.shown = redact_url(url)  # for messages: the URL may carry a password
        self.host, self.port = parse_etcd_url(url)
        if lease_ttl < 1:
            raise ConfigError(
                f"lease_ttl must be at least 1 second (etcd counts whole seconds), got {lease_ttl}"
            )
        self.lease_ttl = math.ceil(lease_ttl)
        self.connect_timeout = connect_timeout
        self._client: aetcd.Client | None = None
        self._lease_id = 0
        self._owned: dict[str, bytes] = {}
        self._unpublished: set[str] = set()  # owned keys etcd may not hold (a put failed, a lease was lost)
        self._outage = False  # logged once per outage
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: list[asyncio.TimerHandle] = []  # retained keys' drops, after a reset
        self._closed = False

    def describe(self) -> str:
        return self.shown

    @property
    def client(self) -> aetcd.Client:
        if self._client is None:
            raise ServiceUnavailableError(
                f"etcd discovery of {self.shown} is not connected: use DistributedRuntime.create"
            )
        return self._client

    async def start(self) -> None:
        username, password = etcd_credentials(self.url)
        self._client = aetcd.Client(
            host=self.host,
            port=self.port,
            username=username,
            password=password,
            timeout=_RPC_TIMEOUT,
            options=dict(_CHANNEL_OPTIONS),
        )
        client = self._client

        async def grant(seconds: float) -> Any:
            try:
                # a read first: etcd grants leases to anyone, but refuses reads without the user
                # it requires, and a worker should learn that now, not at its first put
                await asyncio.wait_for(client.get(b"v1/"), seconds)
                return await asyncio.wait_for(client.lease(self.lease_ttl), seconds)
            except (asyncio.TimeoutError, aetcd.ClientError, OSError) as exc:
                if "authentication failed" in str(exc) or "user name is empty" in str(exc):
                    raise ConfigError(
                        f"etcd at {self.shown} refused the user and password ({exc}): give them in the URL, "
                        "etcd://USER:PASSWORD@HOST:PORT, or in DYN_NB_ETCD_USERNAME and DYN_NB_ETCD_PASSWORD"
                    ) from None
                raise ServiceUnavailableError(
                    f"could not reach etcd at {self.shown} within {self.connect_timeout:g} s ({type(exc).__name__}: "
                    f"{exc}). Start one from Python with `services = await dynamo_nb.LocalServices.start()` "
                    "and pass services.etcd_url, or run `etcd` yourself."
                ) from exc

        try:
            lease = await wait_for_service(grant, what="etcd", url=self.shown, timeout=self.connect_timeout)
        except BaseException:
            await client.close()
            raise
        self._lease_id = lease.id
        self.connection_id = lease.id
        self._tasks.append(
            asyncio.get_running_loop().create_task(self._keep_alive(), name="dynamo_nb etcd lease")
        )

    async def _keep_alive(self) -> None:
        """Renew the lease every third of its TTL. While etcd is away, keep trying twice a second
        (the cached views serve on); once it answers, re-grant a lost lease (the same id) and put
        back every key we own that it may not hold, without restarting anything: even with its data
        lost, a worker is registered again at its next renewal (within half a second of etcd's
        return once it has seen etcd away)."""
        interval = max(self.lease_ttl / 3, 0.3)
        while not self._closed:
            await asyncio.sleep(min(interval, _OUTAGE_RETRY_SECONDS) if self._outage else interval)
            try:
                reply = await self.client.refresh_lease(self._lease_id)
                if reply is None or reply.TTL <= 0:
                    logger.warning(
                        "etcd lease %x expired; granting it again and re-publishing", self._lease_id
                    )
                    await self._grant_again()
                    self._unpublished.update(self._owned)
                for key in list(self._unpublished):
                    value = self._owned.get(key)
                    if value is not None:
                        await self.client.put(key.encode(), value, lease=self._lease_id)
                    self._unpublished.discard(key)
                if self._outage:
                    self._outage = False
                    logger.warning("etcd at %s answers again; this process's keys are published", self.shown)
            except asyncio.CancelledError:
                if not self._closed:  # the loop is ending (asyncio.run's end) with the runtime open
                    await self._close_channel()  # an open gRPC channel can hang the interpreter's exit
                raise
            except Exception as exc:
                if not self._outage:
                    self._outage = True
                    logger.warning(
                        "etcd at %s is unreachable (%s: %s); serving from the cached view, retrying every %.1f s",
                        self.shown,
                        type(exc).__name__,
                        exc,
                        interval,
                    )

    async def _grant_again(self) -> None:
        """A lease with our old id (keys and instance ids stay as they were), or a new one."""
        try:
            lease = await self.client.lease(self.lease_ttl, lease_id=self._lease_id)
        except aetcd.ClientError:  # e.g. the id is still held: take a fresh one
            lease = await self.client.lease(self.lease_ttl)
        self._lease_id = lease.id

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_tasks(self._tasks)
        for timer in self._timers:
            timer.cancel()
        if self._client is not None:
            try:
                await asyncio.wait_for(self._client.revoke_lease(self._lease_id), 2.0)
            except Exception as exc:  # etcd gone: the lease expires on its own
                logger.debug("could not revoke etcd lease: %s", exc)
            await self._close_channel()

    async def _close_channel(self) -> None:
        """Close the gRPC channel to etcd (bounded: a gone etcd does not hold a shutdown)."""
        if self._client is not None:
            try:
                await asyncio.wait_for(self._client.close(), 2.0)
            except Exception as exc:
                logger.debug("closing the etcd client failed: %s", exc)

    async def put(self, key: str, value: bytes) -> None:
        self._owned[key] = value
        try:
            await self.client.put(key.encode(), value, lease=self._lease_id)
        except Exception:
            self._unpublished.add(key)  # the keep-alive puts it once etcd answers
            raise
        self._unpublished.discard(key)

    async def delete(self, key: str) -> None:
        self._owned.pop(key, None)
        self._unpublished.discard(key)
        await self.client.delete(key.encode())

    async def watch_prefix(self, prefix: str) -> PrefixWatch:
        watch = PrefixWatch(prefix)
        first_sync = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(
            self._follow(watch, first_sync), name=f"dynamo_nb etcd watch {prefix}"
        )
        self._tasks.append(task)
        try:
            await asyncio.wait_for(asyncio.shield(first_sync), self.connect_timeout + _RPC_TIMEOUT)
        except asyncio.TimeoutError:
            task.cancel()
            raise ServiceUnavailableError(
                f"etcd at {self.shown} did not answer a read of {prefix!r}"
            ) from None
        return watch

    async def _follow(self, watch: PrefixWatch, first_sync: asyncio.Future[None]) -> None:
        """Snapshot the prefix, then apply watch events from the next revision; resync after errors."""
        attempt = 0
        prefix = watch.prefix.encode()
        seen_revision = 0  # the newest store revision this watch has seen
        while not self._closed:
            try:
                snapshot = await self.client.get_prefix(prefix)
                revision = snapshot.header.revision
                # a revision lower than one already seen: etcd came back without its data
                reset = revision < seen_revision
                if reset:
                    logger.warning(
                        "etcd at %s came back at revision %d, below the %d seen: its data was lost",
                        self.shown, revision, seen_revision,
                    )  # fmt: skip
                    retain = self.retain_seconds
                    self._timers.append(  # cancelled at close (a reset is rare: the list stays short)
                        asyncio.get_running_loop().call_later(retain + 0.05, watch.drop_retained)
                    )
                snapshot_items = {kv.key.decode(): kv.value for kv in snapshot}
                watch.replace_all(snapshot_items, reset=reset, retain_seconds=self.retain_seconds)
                # after a reset the store counts again from its new revision
                seen_revision = revision if reset else max(seen_revision, revision)
                if not first_sync.done():
                    first_sync.set_result(None)
                events = await self.client.watch_prefix(prefix, start_revision=revision + 1)
                attempt = 0
                async for event in events:
                    seen_revision = max(seen_revision, event.kv.mod_revision)
                    key = event.kv.key.decode()
                    if event.kind == aetcd.rtypes.EventKind.PUT:
                        watch.apply(key, event.kv.value)
                    else:
                        watch.apply(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closed:
                    return
                delay = _RETRY_SECONDS[min(attempt, len(_RETRY_SECONDS) - 1)]
                attempt += 1
                logger.warning(
                    "etcd watch on %s failed (%s: %s); resyncing in %.1fs",
                    watch.prefix,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
