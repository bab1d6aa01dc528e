"""The switch of a `dynamo_nb.launch.hosts.HostNetwork`: network namespaces joined in user space.

Run as a program by `HostNetwork.start` (``python -m dynamo_nb.launch.netswitch SETUP``), as
root, with its set-up as one JSON argument. It:

- makes one network namespace per host, each with a TAP device ``eth0`` holding the host's
  address (and ``lo``), no default route, IPv6 off: nothing in a host reaches anything but
  the other hosts;
- forwards Ethernet frames between the TAP devices (it learns which host has which MAC; it
  floods broadcasts and unknown destinations), delaying and dropping them as shaped per host
  pair (this kernel has no ``netem``, so delay, jitter and loss are done here; a host's send
  rate is ``tbf`` on its ``eth0``). Frames between two hosts never overtake each other;
- answers commands, one JSON line each on stdin, one JSON line back on stdout: ``shape``,
  ``cut``, ``heal``, ``stats``, ``stop``;
- when stdin closes (its owner stopped it, exited or was killed) it kills every process left
  in its namespaces and deletes them. Its TAP devices go with it.

A frame from host A to host B is shaped by the first of: the settings of the pair (A, B), of
host A, of host B, of the network. ``delay_ms`` is the one-way delay between the two hosts
(so a round trip takes twice), ``jitter_ms`` a uniform ± spread around it, ``loss`` the chance
that one frame is dropped. A cut pair (or a cut host, with every other) drops every frame and
answers nothing: to its peers a cut host is alive but unreachable.

Example (the set-up argument and a command, as `HostNetwork` sends them)::

    {"hosts": [{"name": "a", "netns": "dnb1x0-a", "address": "198.18.0.2"}], "prefix": 24, "seed": 0}
    {"op": "shape", "a": null, "b": null, "delay_ms": 2, "jitter_ms": 0, "loss": 0.01}
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import random
import signal
import struct
import subprocess
import sys
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
    """SIGKILL every process in namespace ``netns``, then delete it (nothing if it is gone)."""
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", netns, check=False)


@dataclass
class Shape:
    """How frames between two hosts fare: one-way ``delay_ms`` ± ``jitter_ms``, and ``loss``
    (the chance each frame is dropped)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.jitter_ms > self.delay_ms:
            raise ValueError(f"delay_ms must be ≥ 0 and jitter_ms in [0, delay_ms], got {self}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")


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
    released_at: dict[int, float] = field(default_factory=dict)  # last delivery time per destination
    queued: int = 0


def _open_tap(netns: str) -> int:
    """A TAP device ``eth0`` made inside ``netns``; its file descriptor (non-blocking)."""
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
        return (
            self.pair_shapes.get((src, dst))
            or self.host_shapes.get(src)
            or self.host_shapes.get(dst)
            or self.default
        )

    def _blocked(self, src: int, dst: int) -> bool:
        return src in self.cut_hosts or dst in self.cut_hosts or (src, dst) in self.cut_pairs

    def _readable(self, port: _Port) -> None:
        for _ in range(64):  # a burst at a time, then let the loop run the timers
            try:
                frame = os.read(port.fd, _MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
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
        if not shape.delay_ms:
            self._deliver(dst, frame)
            return
        if dst.queued >= _QUEUE_LIMIT:
            src.lost += 1
            return
        assert self.loop is not None
        delay = shape.delay_ms + (
            self.rng.uniform(-shape.jitter_ms, shape.jitter_ms) if shape.jitter_ms else 0.0
        )
        at = max(self.loop.time() + delay / 1000.0, src.released_at.get(dst.index, 0.0))  # no overtaking
        src.released_at[dst.index] = at
        dst.queued += 1
        # epoll waits whole milliseconds, rounded up: ask half of one early to land on time on average
        self.loop.call_at(at - 0.0005, self._deliver_later, src.index, dst, frame)

    def _deliver_later(self, src: int, dst: _Port, frame: bytes) -> None:
        dst.queued -= 1
        if not self._blocked(src, dst.index):  # cut while in flight: lost with the link
            self._deliver(dst, frame)

    def _deliver(self, dst: _Port, frame: bytes) -> None:
        try:
            os.write(dst.fd, frame)
            dst.received += 1
        except OSError:  # its queue is full or it is going away: dropped, as on a wire
            pass

    # -- commands

    def _hosts(self, command: dict[str, Any]) -> tuple[int | None, int | None]:
        found = []
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


async def _serve(switch: Switch) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    switch.start(loop)
    _reply({"ok": True, "ready": True, "pid": os.getpid()})
    while line := await reader.readline():
        try:
            command = json.loads(line)
            if command.get("op") == "stop":
                return
            _reply(switch.command(command))
        except (ValueError, TypeError) as exc:
            _reply({"ok": False, "error": str(exc)})


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
