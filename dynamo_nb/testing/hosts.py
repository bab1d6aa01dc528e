"""Several hosts on one machine: network namespaces on a private switch, with delay, loss and cuts.

Each `Host` of a `HostNetwork` is a Linux network namespace with its own address in a range
reserved for testing (``198.18.0.0/15``, never a real network) and no route anywhere else: a
process started in it (`Host.launch`, `Host.services`) has a network stack of its own, and
reaches the other hosts only through the network's switch (`dynamo_nb.testing.netswitch`, a
process of its own). The switch delays frames, drops a share of them and cuts hosts off
(`HostNetwork.shape`, `cut`, `heal`): what loopback hides — a real round trip, a lost packet,
a peer that vanished without a reset — happens for real. ``tbf`` limits a host's send rate
(`HostNetwork.rate`).

It needs root, ``ip`` (iproute2) and ``/dev/net/tun``; `netns_unavailable` says what is
missing. Everything is torn down by `HostNetwork.stop`, at interpreter exit, and — should this
process be killed — by the switch itself, which deletes its namespaces and kills what is left
in them once its owner is gone. `HostNetwork.start` also removes the leftovers of owners that
died before (`sweep_leftovers`).

Example::

    async with await HostNetwork.start(["a", "b", "c"], delay_ms=2, loss=0.01) as net:
        services = await net["a"].services()              # etcd and nats-server on host a
        worker = await net["c"].launch("components/mocker_worker.py", "--discovery", services.etcd_url)
        await net.cut("c")                                # c is alive but unreachable
        await net.heal("c")
        with net["b"].entered():                          # this thread's new sockets live on b
            ...
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import ipaddress
import itertools
import json
import os
import queue
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ProcessStartError, ProcessTimeoutError
from ..http.lean_client import LeanHttpClient
from ..launch.process_group import pid_alive
from .netswitch import NETNS_DIR, Shape, delete_netns, in_netns

if TYPE_CHECKING:
    from ..launch.launcher import ManagedProcess
    from ..launch.services import LocalServices

__all__ = ["TEST_NETWORK", "Host", "HostNetwork", "netns_unavailable", "our_netns", "sweep_leftovers"]

TEST_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
"""The range hosts' addresses come from: reserved for network tests (RFC 2544), never routed."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,14}$")
_OURS = re.compile(r"^dnb(\d+)x(\d+)-")
_RUNNING: set[HostNetwork] = set()
_SWITCH = Path(__file__).with_name("netswitch.py")
_COUNTER = iter(range(1 << 30))


@functools.lru_cache(maxsize=1)
def netns_unavailable() -> str | None:
    """Why hosts cannot be made here, or None when they can: Linux, root, ``ip`` and ``tc``
    (iproute2), ``/dev/net/tun``, and a namespace that can really be made (root in an
    unprivileged container cannot). Checked once per process.

    Example::

        netns_unavailable()     # None as root on Linux; else e.g. 'network namespaces need root (…)'
    """
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "/dev/net/tun is missing (the tun module)"
    probe = f"dnb{os.getpid()}x-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if made.returncode != 0:
        return (
            f"`ip netns add` fails here ({made.stderr.strip() or made.returncode}): CAP_SYS_ADMIN is missing?"
        )
    delete_netns(probe)
    return None


def our_netns() -> list[str]:
    """The network namespaces a `HostNetwork` (of any process) made and that still exist."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    return sorted(name for name in names if _OURS.match(name))


def sweep_leftovers() -> list[str]:
    """Delete the namespaces whose owning process is gone (and kill what still runs in them);
    the names deleted."""
    removed = []
    for name in our_netns():
        match = _OURS.match(name)
        if match and not pid_alive(int(match.group(1))):
            delete_netns(name)
            removed.append(name)
    return removed


class Host:
    """One host of a `HostNetwork`: a network namespace with one address.

    Attributes:
        name: its name in the network (``"a"``, ``"etcd"``…).
        address: its IPv4 address.
        netns: the namespace's name (``ip netns exec NETNS …``).
    """

    def __init__(self, network: HostNetwork, name: str, address: str, netns: str) -> None:
        """Use `HostNetwork.start`."""
        self.network = network
        self.name = name
        self.address = address
        self.netns = netns

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *command]

    async def launch(self, program: str | os.PathLike[str], *args: Any, **kwargs: Any) -> ManagedProcess:
        """`dynamo_nb.launch.launch` inside this host (same READY lines, same clean stop), with
        the network's cluster secret in ``DYN_NB_CLUSTER_SECRET`` (a component listening on a
        host's address needs one; an ``env`` given wins)."""
        from ..launch.launcher import launch

        kwargs["env"] = {"DYN_NB_CLUSTER_SECRET": self.network.cluster_secret, **(kwargs.get("env") or {})}
        return await launch(program, *args, host=self, **kwargs)

    async def services(self, *, etcd: bool = True, nats: bool = True, timeout: float = 30.0) -> LocalServices:
        """etcd and nats-server running on this host, listening on its address (stopped with
        the network, if not before).

        Example::

            services = await net["svc"].services()
            services.etcd_url        # 'etcd://198.18.0.2:40123'
        """
        from ..launch.services import LocalServices

        services = await LocalServices.start(etcd=etcd, nats=nats, timeout=timeout, host=self)
        self.network._services.append(services)
        return services

    @contextlib.contextmanager
    def entered(self) -> Iterator[Host]:
        """Inside the block, the sockets this thread makes live on this host (they stay there
        after). Processes started meanwhile without a host start here too; other threads (the
        default executor's) are not moved. Around ``await``s, every task of this event loop
        that makes a socket meanwhile makes it here too: enter it where nothing else runs (a
        client driver, a benchmark), and never in two tasks at once.

        Example::

            with net["b"].entered():
                async with httpx.AsyncClient() as client:
                    await client.get(f"http://{net['c'].address}:8000/health")
        """
        with in_netns(self.netns):
            yield self

    def socket(
        self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM, proto: int = 0
    ) -> socket.socket:
        """A new socket living on this host.

        Example::

            sock = net["b"].socket()
            sock.connect((net["a"].address, 7000))
        """
        with self.entered():
            return socket.socket(family, kind, proto)

    async def open_connection(
        self, address: str, port: int, *, timeout: float = 5.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """`asyncio.open_connection` from this host to ``address:port`` (within ``timeout`` s)."""
        sock = self.socket()
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (address, port)), timeout)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    def http_client(self, **kwargs: Any) -> LeanHttpClient:
        """A `dynamo_nb.http.LeanHttpClient` whose connections start on this host (``kwargs``:
        its own, such as ``headers``)."""
        return LeanHttpClient(socket_factory=self.socket, **kwargs)

    def url(self, port: int, scheme: str = "http") -> str:
        """``scheme://ADDRESS:port`` on this host."""
        return f"{scheme}://{self.address}:{port}"

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.address} netns={self.netns}>"


class HostNetwork:
    """Hosts on one private switch. Start it with `HostNetwork.start`; stop it with `stop` (or
    ``async with``).

    Attributes:
        hosts: the hosts by name, in the order given.
        subnet: the addresses' network (inside `TEST_NETWORK`).
        cluster_secret: the secret every component launched on these hosts gets (``DYN_NB_CLUSTER_SECRET``).
    """

    def __init__(
        self, hosts: dict[str, Host], subnet: ipaddress.IPv4Network, switch: subprocess.Popen[bytes]
    ) -> None:
        """Use `HostNetwork.start`."""
        self.hosts = hosts
        self.subnet = subnet
        self._switch = switch
        self.log_path: Path | None = None
        self._services: list[LocalServices] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # what every component launched on these hosts authenticates its peers with
        self.cluster_secret = secrets.token_hex(32)
        self._replies: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read_replies, name="dynamo_nb netswitch replies", daemon=True).start()

    @classmethod
    async def start(
        cls,
        hosts: int | Sequence[str] = 2,
        *,
        subnet: str = "198.18.0.0/24",
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        seed: int = 0,
        timeout: float = 30.0,
    ) -> HostNetwork:
        """Make ``hosts`` (a count, named a, b, c…, or names) on ``subnet``, shaped by ``delay_ms``
        (one way, between any two hosts), ``jitter_ms`` and ``loss`` (see `shape`); ``seed`` makes
        the losses repeatable.

        Raises:
            ConfigError: no root, no ``ip``, a bad name or subnet (the message says which).
            ProcessStartError: the switch could not build the hosts.
        """
        if isinstance(hosts, int) and not 1 <= hosts <= 26:
            raise ConfigError(
                f"{hosts} hosts: name them (a list of names) beyond 26, or ask for at least one"
            )
        names = [chr(ord("a") + i) for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        for name in names:
            if not _NAME.match(name):
                raise ConfigError(f"host name {name!r}: use up to 15 lowercase letters, digits, '-' or '_'")
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"host names must be distinct and at least one, got {names}")
        network = ipaddress.ip_network(subnet)
        if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(TEST_NETWORK):
            raise ConfigError(f"subnet {subnet!r} must lie inside {TEST_NETWORK} (reserved for tests)")
        addresses = list(network.hosts())[1:]  # .1 stays free
        if len(addresses) < len(names):
            raise ConfigError(f"subnet {subnet} has room for {len(addresses)} hosts, not {len(names)}")
        reason = netns_unavailable()
        if reason is not None:
            raise ConfigError(f"cannot make hosts here: {reason}")
        await asyncio.to_thread(sweep_leftovers)
        tag = f"dnb{os.getpid()}x{next(_COUNTER)}"
        layout = [
            {"name": name, "netns": f"{tag}-{name}", "address": str(address)}
            for name, address in zip(names, addresses, strict=False)
        ]
        setup = json.dumps({"hosts": layout, "prefix": network.prefixlen, "seed": seed})
        log_path = Path(tempfile.gettempdir()) / "dynamo_nb-logs" / f"netswitch-{tag}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:  # noqa: ASYNC230 - opening the log for the child
            switch = subprocess.Popen(  # noqa: ASYNC220 - fork/exec returns at once
                [sys.executable, "-I", str(_SWITCH), setup],  # the standard library only
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # not in our group: it outlives us to clean up
            )
        net = cls({}, network, switch)
        net.log_path = log_path
        net.hosts = {h["name"]: Host(net, h["name"], h["address"], h["netns"]) for h in layout}
        _RUNNING.add(net)
        try:
            first = await asyncio.to_thread(net._read_reply, timeout)  # its "ready" line
            if not first.get("ok"):
                raise ProcessStartError(f"the switch could not build the hosts: {first.get('error')}")
            if delay_ms or jitter_ms or loss:
                await net.shape(delay_ms=delay_ms, jitter_ms=jitter_ms, loss=loss)
        except BaseException:
            await net.stop()
            raise
        return net

    def __getitem__(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise ConfigError(f"no host {name!r}: hosts are {', '.join(self.hosts)}") from None

    @property
    def running(self) -> bool:
        """Whether the switch (and so the hosts) is up."""
        return self._switch.poll() is None

    # -- the switch

    def _read_replies(self) -> None:
        """The switch's answers, one line each, into the queue ("" once it exits)."""
        assert self._switch.stdout is not None
        with contextlib.suppress(OSError, ValueError):
            for line in self._switch.stdout:
                self._replies.put(line)
        self._replies.put(b"")

    def _read_reply(self, timeout: float, ident: int | None = None) -> dict[str, Any]:
        """The switch's reply (to command ``ident``: late replies to earlier ones are skipped).

        Raises:
            ProcessStartError: the switch exited (its log's tail says why).
            ProcessTimeoutError: no reply within ``timeout`` s (the switch keeps running).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ProcessTimeoutError(f"the network switch did not answer within {timeout:g} s") from None
            if not line:
                tail = ""
                if self.log_path is not None:
                    with contextlib.suppress(OSError):
                        tail = self.log_path.read_text(errors="replace").strip()[-2000:]
                raise ProcessStartError(f"the network switch exited: {tail or 'no output'}")
            reply = dict(json.loads(line))
            if ident is None or reply.get("id") == ident:
                return reply

    def _call(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            if not self.running:
                raise ConfigError("this host network was stopped; start a new one")
            ident = next(self._ids)
            assert self._switch.stdin is not None
            try:
                self._switch.stdin.write((json.dumps({**command, "id": ident}) + "\n").encode())
                self._switch.stdin.flush()
            except (OSError, ValueError):
                raise ConfigError("this host network's switch is gone; start a new one") from None
            reply = self._read_reply(timeout, ident)
        if not reply.get("ok"):
            raise ConfigError(str(reply.get("error")))
        return reply

    async def _command(self, command: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, command, timeout)

    def _names(self, a: str | Host | None, b: str | Host | None) -> dict[str, str | None]:
        names = {}
        for key, host in (("a", a), ("b", b)):
            name = host.name if isinstance(host, Host) else host
            names[key] = None if name is None else self[name].name  # an unknown host: a clear error
        return names

    async def shape(
        self,
        a: str | Host | None = None,
        b: str | Host | None = None,
        *,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
    ) -> None:
        """Shape frames between every two hosts (no host given), to and from host ``a``, or between
        ``a`` and ``b``: one-way ``delay_ms`` ± ``jitter_ms`` (uniform) and ``loss``, the chance a
        frame is dropped. A pair's shape wins over its hosts' (two shaped hosts: the larger of each
        value, both ways), theirs over the network's; shaping the whole network forgets the
        others. Frames between two hosts keep their order.

        Example::

            await net.shape(delay_ms=2, loss=0.01)        # every link: RTT 4 ms, 1 % loss each way
            await net.shape("c", delay_ms=20)             # host c is far away
        """
        try:
            Shape(delay_ms, jitter_ms, loss)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if a is None and b is not None:
            raise ConfigError("shape(None, b): name the first host")
        await self._command(
            {"op": "shape", **self._names(a, b), "delay_ms": delay_ms, "jitter_ms": jitter_ms, "loss": loss}
        )

    async def cut(self, a: str | Host, b: str | Host | None = None) -> None:
        """Cut host ``a`` off from every other host (or only from ``b``): every frame between them
        is dropped, frames in flight too, and nothing answers — no reset, no refusal. The hosts
        keep running. `heal` joins them again."""
        await self._command({"op": "cut", **self._names(a, b)})

    async def heal(self, a: str | Host | None = None, b: str | Host | None = None) -> None:
        """Undo `cut` for host ``a`` (or the pair ``a``, ``b``; no host: every cut)."""
        await self._command({"op": "heal", **self._names(a, b)})

    async def rate(self, host: str | Host, mbit: float | None) -> None:
        """Limit what ``host`` sends to ``mbit`` megabits per second (``tbf`` on its ``eth0``);
        None lifts the limit."""
        target = self[host.name if isinstance(host, Host) else host]
        if mbit is None:
            command = ["tc", "-n", target.netns, "qdisc", "del", "dev", "eth0", "root"]
        elif mbit <= 0:
            raise ConfigError(f"rate must be a positive number of megabits per second, got {mbit}")
        else:
            command = [
                "tc", "-n", target.netns, "qdisc", "replace", "dev", "eth0", "root",
                "tbf", "rate", f"{mbit}mbit", "burst", "32kb", "latency", "400ms",
            ]  # fmt: skip
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=10)
        if done.returncode != 0 and mbit is not None:
            raise ConfigError(f"tc could not limit {target.name}: {done.stderr.strip()}")

    async def stats(self) -> dict[str, dict[str, int]]:
        """Per host: frames it ``sent``, frames delivered to it (``received``), its frames dropped
        by ``loss`` (``lost``) and by a cut (``cut``)."""
        return dict((await self._command({"op": "stats"}))["hosts"])

    # -- stop

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop the processes launched in the hosts and the services started on them, then the
        switch, which deletes the hosts. Stopping twice is harmless.

        Example::

            await net.stop()
            net.running      # False
        """
        from ..launch.launcher import launched

        inside = {host.netns for host in self.hosts.values()}
        try:
            for process in launched():
                if isinstance(process.host, Host) and process.host.netns in inside:
                    with contextlib.suppress(Exception):
                        await process.stop(timeout=5.0)
            services, self._services = self._services, []
            for service in services:
                with contextlib.suppress(Exception):
                    await service.stop()
        finally:
            await asyncio.to_thread(self._stop_now, timeout)

    def _stop_now(self, timeout: float = 10.0) -> None:
        _RUNNING.discard(self)
        for service in self._services:
            service._stop_now()
        self._services = []
        if self._switch.poll() is None and self._switch.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._switch.stdin.close()  # end of input: the switch tears down and exits
        try:
            self._switch.wait(timeout)
        except subprocess.TimeoutExpired:
            self._switch.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._switch.wait(5)
        for host in self.hosts.values():  # should the switch have failed at it
            if os.path.exists(os.path.join(NETNS_DIR, host.netns)):
                delete_netns(host.netns)
        if self._switch.stdout is not None:
            with contextlib.suppress(OSError):
                self._switch.stdout.close()

    async def __aenter__(self) -> HostNetwork:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h.name}={h.address}" for h in self.hosts.values())
        return f"<HostNetwork {self.subnet} {hosts}{'' if self.running else ' stopped'}>"


@atexit.register
def _stop_all_at_exit() -> None:
    if not _RUNNING:
        return
    from ..launch.launcher import stop_all_now

    stop_all_now()  # what runs in the hosts stops cleanly before the switch kills what is left
    for network in list(_RUNNING):
        network._stop_now(5.0)
