"""The switch of a `dynamo_nb.testing.hosts.HostNetwork`: network namespaces joined in user space.

Run as a program by `HostNetwork.start` (``python -I .../netswitch.py SETUP``: it imports only
the standard library), as root, with its set-up as one JSON argument. It:

- makes one network namespace per host, each with a TAP device ``eth0`` holding the host's
  address (and ``lo``), no default route, IPv6 off: nothing in a host reaches anything but
  the other hosts;
- forwards Ethernet frames between the TAP devices (it learns which host has which MAC; it
  floods broadcasts and unknown destinations), delaying and dropping them as shaped per host
  pair (delay, jitter and loss are done here, so no ``netem`` qdisc is needed; a host's send
  rate is ``tbf`` on its ``eth0``). Frames from one host to another leave in the order they
  came, each pair in a queue of its own;
- answers commands, one JSON line each on stdin (with an ``id``), one JSON line back on stdout
  (with the same ``id``): ``shape``, ``cut``, ``heal``, ``stats``, ``stop``;
- when stdin closes or its owner (its parent) is gone — stopped, exited or killed — it kills
  every process left in its namespaces and deletes them. Its TAP devices go with it.

A frame from host A to host B is shaped by the pair (A, B)'s settings if it has some, else by
those of host A and host B (the larger of each value, so both directions fare alike), else by
the network's. ``delay_ms`` is the one-way delay between the two hosts (so a round trip takes
twice), ``jitter_ms`` a uniform ± spread around it, ``loss`` the chance that one frame is
dropped. A cut pair (or a cut host, with every other) drops every frame and answers nothing:
to its peers a cut host is alive but unreachable.

Example (the set-up argument and a command, as `HostNetwork` sends them)::

    {"hosts": [{"name": "a", "netns": "dnb1x0-a", "address": "198.18.0.2"}], "prefix": 24, "seed": 0}
    {"op": "shape", "a": null, "b": null, "delay_ms": 2, "jitter_ms": 0, "loss": 0.01}
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NETNS_DIR", "Shape", "delete_netns", "in_netns", "main"]

NETNS_DIR = "/run/netns"
"""Where ``ip netns`` keeps named namespaces."""

_CLONE_NEWNET = 0x40000000
_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_MAX_FRAME = 65536
_QUEUE_LIMIT = 4096  # frames waiting out their delay per destination; more are dropped, as a full queue


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


@contextlib.contextmanager
def in_netns(netns: str) -> Iterator[None]:
    """Inside the block, this thread is in network namespace ``netns`` (a name under
    `NETNS_DIR`): the sockets and devices it makes belong there (and stay there after)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def delete_netns(netns: str) -> None:
    """SIGKILL every process in namespace ``netns`` (again, while any forked meanwhile), then
    delete it; nothing if it is gone.

    Example::

        delete_netns("dnb4242x0-a")
    """
    for _ in range(20):
        pids = _ip("netns", "pids", netns, check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    _ip("netns", "del", netns, check=False)


@dataclass
class Shape:
    """How frames between two hosts fare: one-way ``delay_ms`` ± ``jitter_ms``, and ``loss``
    (the chance each frame is dropped).

    Example:
        >>> Shape(delay_ms=2, loss=0.01).worst(Shape(delay_ms=5))
        Shape(delay_ms=5, jitter_ms=0.0, loss=0.01)
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.delay_ms:
            raise ValueError(f"delay_ms must be ≥ 0 and jitter_ms in [0, delay_ms], got {self}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")

    def worst(self, other: Shape) -> Shape:
        """The larger of each value of the two."""
        return Shape(
            max(self.delay_ms, other.delay_ms),
            max(self.jitter_ms, other.jitter_ms),
            max(self.loss, other.loss),
        )


@dataclass
class _Port:
    """One host's TAP device on the switch."""

    index: int
    name: str
    netns: str
    address: str
    fd: int = -1
    sent: int = 0  # frames it sent into the switch
    received: int = 0  # frames the switch delivered to it
    lost: int = 0  # its frames dropped by loss
    cut: int = 0  # its frames dropped by a cut
    # frames on their way to each destination, (due time, frame), in the order they came
    queues: dict[int, collections.deque[tuple[float, bytes]]] = field(default_factory=dict)
    queued: int = 0  # frames on their way to this port, from every source


def _open_tap(netns: str) -> int:
    """A TAP device ``eth0`` made inside ``netns``; its file descriptor (non-blocking)."""
    import fcntl  # Linux only, as the rest of the switch

    with in_netns(netns):
        for knob in ("all", "default"):  # no IPv6: no router solicitations or DAD on the wire
            with contextlib.suppress(OSError), open(f"/proc/sys/net/ipv6/conf/{knob}/disable_ipv6", "w") as f:
                f.write("1")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        try:
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", b"eth0", _IFF_TAP | _IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
    return fd


class Switch:
    """The namespaces, their TAP devices and the forwarding between them."""

    def __init__(self, hosts: list[dict[str, str]], prefix: int, seed: int) -> None:
        self.ports = [_Port(i, h["name"], h["netns"], h["address"]) for i, h in enumerate(hosts)]
        self.by_name = {port.name: port for port in self.ports}
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.macs: dict[bytes, int] = {}
        self.default = Shape()
        self.host_shapes: dict[int, Shape] = {}
        self.pair_shapes: dict[tuple[int, int], Shape] = {}
        self.cut_hosts: set[int] = set()
        self.cut_pairs: set[tuple[int, int]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- set-up and tear-down

    def build(self) -> None:
        for port in self.ports:
            _ip("netns", "add", port.netns)
            port.fd = _open_tap(port.netns)
            for command in (
                ["link", "set", "lo", "up"],
                ["link", "set", "eth0", "mtu", "1500"],
                ["addr", "add", f"{port.address}/{self.prefix}", "dev", "eth0"],
                ["link", "set", "eth0", "up"],
            ):
                _ip("-n", port.netns, *command)

    def teardown(self) -> None:
        for port in self.ports:
            if port.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(port.fd)
                port.fd = -1
            delete_netns(port.netns)

    # -- forwarding

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        for port in self.ports:
            loop.add_reader(port.fd, self._readable, port)

    def _shape(self, src: int, dst: int) -> Shape:
        pair = self.pair_shapes.get((src, dst))
        if pair is not None:
            return pair
        ends = [
            shape for shape in (self.host_shapes.get(src), self.host_shapes.get(dst)) if shape is not None
        ]
        if not ends:
            return self.default
        return ends[0] if len(ends) == 1 else ends[0].worst(ends[1])

    def _blocked(self, src: int, dst: int) -> bool:
        return src in self.cut_hosts or dst in self.cut_hosts or (src, dst) in self.cut_pairs

    def _readable(self, port: _Port) -> None:
        for _ in range(64):  # a burst at a time, then let the loop run the timers
            try:
                frame = os.read(port.fd, _MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the device is gone or broken: stop reading it rather than spin
                assert self.loop is not None
                self.loop.remove_reader(port.fd)
                return
            if len(frame) < 14:
                continue
            port.sent += 1
            self.macs[frame[6:12]] = port.index
            destination = None if frame[0] & 1 else self.macs.get(frame[0:6])
            targets = [destination] if destination is not None else [p.index for p in self.ports]
            for target in targets:
                if target != port.index:
                    self._forward(port, self.ports[target], frame)

    def _forward(self, src: _Port, dst: _Port, frame: bytes) -> None:
        if self._blocked(src.index, dst.index):
            src.cut += 1
            return
        shape = self._shape(src.index, dst.index)
        if shape.loss and self.rng.random() < shape.loss:
            src.lost += 1
            return
        queue = src.queues.setdefault(dst.index, collections.deque())
        if not shape.delay_ms and not queue:
            self._deliver(dst, frame)
            return
        if dst.queued >= _QUEUE_LIMIT:
            src.lost += 1
            return
        assert self.loop is not None
        jitter = self.rng.uniform(-shape.jitter_ms, shape.jitter_ms) if shape.jitter_ms else 0.0
        at = self.loop.time() + (shape.delay_ms + jitter) / 1000.0
        if queue:  # no overtaking: it leaves after the frames queued before it
            at = max(at, queue[-1][0])
        queue.append((at, frame))
        dst.queued += 1
        if len(queue) == 1:
            self._schedule(src, dst, at)

    def _schedule(self, src: _Port, dst: _Port, at: float) -> None:
        assert self.loop is not None
        # epoll waits whole milliseconds, rounded up: ask half of one early to land on time on average
        self.loop.call_at(at - 0.0005, self._drain, src, dst)

    def _drain(self, src: _Port, dst: _Port) -> None:
        """Deliver the frames from ``src`` to ``dst`` that are due, in order; wake up for the next."""
        assert self.loop is not None
        queue = src.queues[dst.index]
        due = self.loop.time() + 0.0005
        while queue and queue[0][0] <= due:
            _, frame = queue.popleft()
            dst.queued -= 1
            if not self._blocked(src.index, dst.index):  # cut while in flight: lost with the link
                self._deliver(dst, frame)
        if queue:
            self._schedule(src, dst, queue[0][0])

    def _deliver(self, dst: _Port, frame: bytes) -> None:
        try:
            os.write(dst.fd, frame)
            dst.received += 1
        except OSError:  # its queue is full or it is going away: dropped, as on a wire
            pass

    # -- commands

    def _hosts(self, command: dict[str, Any]) -> tuple[int | None, int | None]:
        found: list[int | None] = []
        for key in ("a", "b"):
            name = command.get(key)
            if name is None:
                found.append(None)
                continue
            if name not in self.by_name:
                raise ValueError(f"no host {name!r}: hosts are {', '.join(self.by_name)}")
            found.append(self.by_name[name].index)
        return found[0], found[1]

    def command(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command.get("op")
        a, b = self._hosts(command)
        if a is None and b is not None:
            raise ValueError("name the first host (a) before the second (b)")
        if op == "shape":
            shape = Shape(
                float(command.get("delay_ms", 0)),
                float(command.get("jitter_ms", 0)),
                float(command.get("loss", 0)),
            )
            if a is None:
                self.default, self.host_shapes, self.pair_shapes = shape, {}, {}
            elif b is None:
                self.host_shapes[a] = shape
            else:
                self.pair_shapes[(a, b)] = self.pair_shapes[(b, a)] = shape
            return {"ok": True}
        if op in ("cut", "heal"):
            if a is None:
                if op == "cut":
                    raise ValueError("cut needs a host")
                self.cut_hosts.clear()
                self.cut_pairs.clear()
            elif b is None:
                (self.cut_hosts.add if op == "cut" else self.cut_hosts.discard)(a)
            else:
                for pair in ((a, b), (b, a)):
                    (self.cut_pairs.add if op == "cut" else self.cut_pairs.discard)(pair)
            return {"ok": True}
        if op == "stats":
            return {
                "ok": True,
                "hosts": {
                    p.name: {"sent": p.sent, "received": p.received, "lost": p.lost, "cut": p.cut}
                    for p in self.ports
                },
            }
        raise ValueError(f"unknown op {op!r}: use shape, cut, heal, stats or stop")


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _owner_gone(owner: int) -> None:
    """Return once the owner (this process's parent) is gone: it is then re-parented."""
    while os.getppid() == owner:  # noqa: ASYNC110 - nothing to wait on but the parent pid
        await asyncio.sleep(0.5)


async def _serve(switch: Switch) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    switch.start(loop)
    _reply({"ok": True, "ready": True, "pid": os.getpid()})
    # stdin's end closes with the owner, unless a child it forked holds it: watch the owner too
    watch = loop.create_task(_owner_gone(os.getppid()))
    while True:
        read = loop.create_task(reader.readline())
        await asyncio.wait({read, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            read.cancel()
            return
        line = read.result()
        if not line:
            return
        ident = None
        try:
            command = json.loads(line)
            ident = command.get("id")
            if command.get("op") == "stop":
                return
            _reply({**switch.command(command), "id": ident})
        except (ValueError, TypeError, AttributeError) as exc:
            _reply({"ok": False, "error": str(exc), "id": ident})


def main() -> None:
    """Read the set-up argument, build the hosts, serve commands until stdin closes, tear down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the owner; stdin EOF ends us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    setup = json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}")
    switch = Switch(setup.get("hosts", []), int(setup.get("prefix", 24)), int(setup.get("seed", 0)))
    try:
        try:
            switch.build()
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            _reply({"ok": False, "error": f"cannot build the hosts: {detail.strip()}"})
            return
        asyncio.run(_serve(switch))
    finally:
        switch.teardown()


if __name__ == "__main__":
    main()
