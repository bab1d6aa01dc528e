"""Start components (or any program) as subprocesses from a notebook cell or a script.

`launch` starts ``python components/hf_worker.py --flags…`` in its own process group, waits
until it is ready (a ``READY`` line, or its instance in discovery), shows its output live (a
widget in a notebook, ``[name]``-prefixed lines in a script; always a log file), and returns
a `ManagedProcess`. ``await proc.stop()`` sends SIGTERM to the program, waits, then SIGKILLs
its group (what outlived it gets SIGTERM, then SIGKILL). Whatever is still running is stopped
when the interpreter (or the kernel) exits; on Linux a launched program also gets SIGTERM if
the launching process is killed.

Example::

    worker = await launch("components/hf_worker.py", "--discovery", services.etcd_url)
    worker.ready_line
    # 'READY dynamo.backend.generate instance=694d9a8e... address=tcp://127.0.0.1:40713 model=tiny-llama'
    launched()
    # [<ManagedProcess hf_worker pid=4242 ready>]
    await worker.stop()
    # 0
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, LaunchError, ProcessTimeoutError
from ..jupyter import in_notebook
from ..runtime.program import parse_ready_line
from .declarations import split_reference
from .ledger import (
    Leftover,
    ledger,
    leftovers,
    mark_settled,
    process_start,
    release,
    settle_leftovers_once,
)
from .logview import LogSink, log_sink
from .network_host import NetworkHost
from .paths import resolve_program
from .process_group import OWN_PROCESS_GROUP, guarded_command, signal_group, stop_group
from .reaper import GRACE_S

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

# "ValueError: …", "torch.OutOfMemoryError: …", "(EngineCore pid=7) OSError: …": a raised exception
_EXCEPTION_LINE = re.compile(
    r"(?:^|[\s)])(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::|$)"
)

__all__ = ["DEFAULT_READY_PATTERN", "ManagedProcess", "adopt_leftovers", "launch", "launched"]

DEFAULT_READY_PATTERN = r"^READY\b"
"""Our components print ``READY …`` once they serve; `launch` waits for such a line."""

_LAUNCHED: dict[int, ManagedProcess] = {}  # pid → process; held strongly so exit clean-up finds it
# pid → how each launched process ended ("exited -9", "stopped"), the last _ENDED_KEPT of them:
# what its log view must end with (the browser test holds the two together)
_ENDED: dict[int, str] = {}
_ENDED_KEPT = 1000


def _record_end(pid: int, how: str) -> None:
    _ENDED.setdefault(pid, how)
    while len(_ENDED) > _ENDED_KEPT:
        del _ENDED[next(iter(_ENDED))]


def _ends() -> dict[int, str | None]:
    """How each process `launch` started ended (`_ENDED`; one that ended unseen, by its exit
    status), None for those still running: what their log views must show."""
    now = {p.pid: None if p.running else p._ended_as(p.returncode) for p in _LAUNCHED.values()}
    return {**now, **_ENDED}


class ManagedProcess:
    """A program started by `launch`: its output, readiness and stop.

    Attributes:
        name: a short name (the script's stem unless given), used in logs.
        command: the full command line.
        pid: the process id (also its process group id).
        log_path: the file holding everything it printed.
        ready_line: the line that made it ready ("" when readiness was not a line).
        instance_id: the instance it serves, from discovery or its READY line's ``instance=``
            (the first, when it lists several), else None.
        url: its READY line's ``url=`` (a frontend's address), else None.
        host: the `dynamo_nb.testing.hosts.Host` it runs in, None on this machine's own network.
    """

    def __init__(
        self,
        name: str,
        command: list[str],
        process: subprocess.Popen[bytes],
        log_path: Path,
        host: NetworkHost | None = None,
    ) -> None:
        """Use `launch`."""
        self.host = host
        self.name = name
        self.command = command
        self.pid = process.pid
        self.log_path = log_path
        self.ready_line = ""
        self.instance_id: int | None = None
        self.url: str | None = None
        self.started_at = time.time()
        self.ready_after: float | None = None
        self._process = process
        self._lines: deque[str] = deque(maxlen=200)
        self._errors: deque[str] = deque(maxlen=8)  # exception lines, kept though the tail scrolls on
        self._sink: LogSink | None = None
        self._ready_pattern: re.Pattern[str] | None = None
        self._changed = asyncio.Event()  # a ready line came, or the process exited
        self._exited = asyncio.Event()
        self._exit_watcher: asyncio.AbstractEventLoop | None = None  # the loop a pidfd wakes
        self._pidfd: int | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while it runs."""
        return self._process.poll()

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process.poll() is None

    def logs(self, last: int | None = None) -> list[str]:
        """The last output lines it printed (up to 200 are kept in memory; all are in `log_path`)."""
        lines = list(self._lines)
        return lines if last is None else lines[-last:]

    def tail(self, last: int = 20) -> str:
        """The last ``last`` output lines as one string."""
        return "\n".join(self.logs(last))

    def error_lines(self) -> list[str]:
        """The exception lines it printed (``OSError: [Errno 28] …``), oldest first, up to 8, each
        once: a crash's root cause, which a long traceback after it pushes out of `tail`."""
        return list(self._errors)

    def cpu_seconds(self) -> float:
        """CPU time (user + system, seconds) the process itself has used so far (Linux ``/proc``)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            raise ProcessLookupError(
                f"{self.name} (pid {self.pid}) is not running, or this is not Linux"
            ) from None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (e.g. ``signal.SIGKILL`` to test failover)."""
        signal_group(self.pid, signum)

    async def wait(self, timeout: float | None = None) -> int:
        """Wait until it exits (raises `TimeoutError` after ``timeout`` seconds); its exit status."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while (code := self._process.poll()) is None:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise ProcessTimeoutError(f"{self.name} (pid {self.pid}) still runs after {timeout:g} s")
            if self._exit_watcher is loop:  # woken at once; polled now and then all the same
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), min(left or 1.0, 1.0))
            else:  # another event loop than launch's (a pidfd there could not wake this one)
                await asyncio.sleep(0.05)
        await self._drain(0.2, cancel=False)  # children may still hold the pipe: keep reading them
        return code

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Set `_exited` the moment the process exits (Linux pidfd); elsewhere `wait` polls."""
        try:
            fd = os.pidfd_open(self.pid)  # type: ignore[attr-defined,unused-ignore]  # Linux only; the call is guarded
        except (AttributeError, OSError):
            return
        try:
            loop.add_reader(fd, self._on_exit)
        except (OSError, NotImplementedError, RuntimeError):
            os.close(fd)
            return
        self._exit_watcher, self._pidfd = loop, fd

    def _on_exit(self) -> None:
        _record_end(self.pid, self._ended_as(self._process.poll()))
        self._unwatch_exit()
        self._exited.set()
        self._changed.set()

    def _unwatch_exit(self) -> None:
        """Close the pidfd (its loop may be closed already: then only the descriptor)."""
        fd, self._pidfd = self._pidfd, None
        if fd is None:
            return
        if self._exit_watcher is not None and not self._exit_watcher.is_closed():
            self._exit_watcher.remove_reader(fd)
        os.close(fd)

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the program, wait up to ``timeout`` s, then SIGKILL its group; its exit status.

        It stops its own children; anything left in the group afterwards gets SIGTERM, a second,
        then SIGKILL. Stopping twice is harmless.
        """
        self._stopped = True
        code = await asyncio.to_thread(stop_group, self._process, timeout)
        _record_end(self.pid, self._ended_as(code))  # "stopped", unless its exit was seen before
        self._unwatch_exit()
        await self._drain()
        _LAUNCHED.pop(self.pid, None)
        return code

    def _stop_now(self, timeout: float) -> None:
        stop_group(self._process, timeout)

    async def __aenter__(self) -> ManagedProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        code = self._process.poll()
        if code is not None:
            state = f"exited {code}"
        else:
            state = "ready" if self.ready_after is not None else "starting"
        return f"<ManagedProcess {self.name} pid={self.pid} {state}>"

    # -- output

    def _start_pump(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pump_task = loop.create_task(self._pump(), name=f"dynamo_nb.launch:{self.name}")

    async def _pump(self) -> None:
        assert self._process.stdout is not None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), self._process.stdout
        )
        try:
            with open(self.log_path, "ab", buffering=0) as log:  # noqa: ASYNC230 - small appends
                while True:
                    try:
                        raw = await reader.readline()
                    except ValueError:  # a line over 1 MiB: take it in pieces
                        raw = await reader.read(1 << 20)
                    if not raw:
                        break
                    log.write(raw)
                    self._on_line(raw.decode(errors="replace").rstrip("\r\n"))
        finally:
            transport.close()
            if self._sink is not None:
                self._sink.status(await self._final_status())

    async def _final_status(self, wait: float = 2.0) -> str:
        """What the log view ends with once the output closed: ``stopped`` (by `stop`), else
        the exit status, which can come a moment after the pipe closes (a process closes its
        output while it exits, and is reaped after), or ``closed`` if it still runs."""
        deadline = time.monotonic() + wait
        while True:
            code = self._process.poll()
            if self._stopped or code is not None:
                return self._ended_as(code)
            if time.monotonic() >= deadline:
                return "closed"
            await asyncio.sleep(0.01)

    def _ended_as(self, code: int | None) -> str:
        """How it ended, as its log view and `_ENDED` say it: ``stopped`` (by `stop`) or ``exited CODE``."""
        return "stopped" if self._stopped else f"exited {code}"

    def _on_line(self, text: str) -> None:
        self._lines.append(text)
        if _EXCEPTION_LINE.search(text) and text not in self._errors:
            self._errors.append(text)
        if self._sink is not None:
            self._sink.line(text)
        pattern = self._ready_pattern
        if pattern is not None and not self.ready_line and pattern.search(text):
            self.ready_line = text
            self._changed.set()

    async def _drain(self, timeout: float = 2.0, cancel: bool = True) -> None:
        """Let the output pump finish (the pipe closes once the whole group is gone)."""
        if self._pump_task is not None and not self._pump_task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._pump_task), timeout)
            except asyncio.TimeoutError:
                if cancel:
                    self._pump_task.cancel()

    # -- readiness

    async def _wait_ready(
        self, instance: str | None, runtime: DistributedRuntime | None, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        client = await runtime.endpoint(instance).client() if runtime and instance else None
        known = set(client.instance_ids()) if client is not None else set()
        waiting_for = []
        if self._ready_pattern is not None:
            waiting_for.append(f"a line matching {self._ready_pattern.pattern!r}")
        if client is not None:
            waiting_for.append(f"a new instance of {instance}")
        while True:
            self._changed.clear()  # what sets it from here on wakes the wait below
            new_ids = [i for i in client.instance_ids() if i not in known] if client is not None else [None]
            if new_ids and (self._ready_pattern is None or self.ready_line):
                break
            code = self._process.poll()
            if code is not None:
                await self._drain()
                await self._fail(f"{self.name} exited with status {code} before it was ready", code)
            if loop.time() >= deadline:
                await self._fail(
                    f"{self.name} was not ready within {timeout:g} s (waited for {' and '.join(waiting_for)}); "
                    f"it was stopped. Raise timeout= or look at its log: {self.log_path}",
                    None,
                )
            # discovery is polled; a line or an exit (when watched) wakes this at once
            polling = client is not None or self._exit_watcher is not loop
            try:
                await asyncio.wait_for(self._changed.wait(), 0.05 if polling else deadline - loop.time())
            except asyncio.TimeoutError:
                pass
        self.ready_after = time.time() - self.started_at
        if new_ids[0] is not None:
            self.instance_id = new_ids[0]
        ready = parse_ready_line(self.ready_line)
        fields = ready[1] if ready is not None else {}
        if self.instance_id is None and fields.get("instance"):
            try:
                self.instance_id = int(fields["instance"].split(",")[0], 16)
            except ValueError:
                pass
        if fields.get("url"):
            self.url = fields["url"]
        if self._sink is not None:
            self._sink.status(f"ready after {self.ready_after:.1f} s")

    async def _fail(self, message: str, code: int | None) -> None:
        await self.stop(timeout=2.0)
        raise self.start_error(message, code)

    def start_error(self, message: str, code: int | None) -> LaunchError:
        """A `LaunchError` with ``message``, the exception lines it printed and its last 20 lines."""
        return LaunchError(message, log_tail=self.tail(20), returncode=code, errors=self.error_lines())


def _command(program: str, args: list[str], cwd: Path) -> tuple[str, list[str]]:
    """(name, argv): ``-m module`` and ``*.py`` run on this Python (unbuffered), else an executable."""
    if program == "-m":
        if not args:
            raise ConfigError("launch('-m', …) needs a module name after '-m'")
        return args[0].rsplit(".", 1)[-1], [sys.executable, "-u", "-m", *args]
    if program.endswith(".py"):
        script = resolve_program(program, cwd)
        return script.stem, [sys.executable, "-u", str(script), *args]
    executable = shutil.which(program) or (str(resolve_program(program, cwd)) if "/" in program else None)
    if executable is None:
        raise ConfigError(f"{program!r} is not a .py file, '-m', or an executable on PATH")
    return Path(executable).name, [executable, *args]


def _workdir(cwd: str | os.PathLike[str] | None) -> Path:
    """The folder a launched program runs in (and its relative paths resolve from)."""
    return Path(os.path.abspath(cwd if cwd is not None else os.curdir))


def _checked_program(reference: str, cwd: str | os.PathLike[str] | None) -> Path:
    """What runs for ``FILE`` or ``FILE:NAME`` (resolved as `launch` resolves programs): a
    notebook's checked export, exported into the cache unless its code was exported before, or a
    ``.py`` file checked to run NAME (`dynamo_nb.launch.programs.program_file`)."""
    from .programs import reference_program

    return reference_program(reference, _workdir(cwd))


def _start(
    program: str | os.PathLike[str],
    args: tuple[str | int | float | os.PathLike[str], ...],
    *,
    name: str | None,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    log_dir: str | os.PathLike[str] | None,
    host: NetworkHost | None = None,
) -> ManagedProcess:
    """Fork/exec the program in a process group of its own (in this session); output to a pipe;
    inside ``host``'s network namespace when one is given."""
    workdir = _workdir(cwd)
    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    default_name, command = _command(os.fspath(program), argv, workdir)
    folder = Path(log_dir) if log_dir is not None else Path(tempfile.gettempdir()) / "dynamo_nb-logs"
    folder.mkdir(parents=True, exist_ok=True)
    if host is not None:
        command = host.wrap(command)
    process = subprocess.Popen(
        guarded_command(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=workdir,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        **OWN_PROCESS_GROUP,
    )
    name = name or default_name
    managed = ManagedProcess(name, command, process, folder / f"{name}-{process.pid}.log", host)
    _LAUNCHED[process.pid] = managed
    ledger().record(process.pid, name, command, str(managed.log_path))
    return managed


async def launch(
    program: str | os.PathLike[str],
    *args: str | int | float | os.PathLike[str],
    name: str | None = None,
    ready: str | None = DEFAULT_READY_PATTERN,
    instance: str | None = None,
    runtime: DistributedRuntime | None = None,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    show_logs: bool = True,
    host: NetworkHost | None = None,
) -> ManagedProcess:
    """Start ``program *args`` in its own process group and wait until it is ready.

    Args:
        program: a ``.py`` file (run on this Python; relative paths are also looked up in
            the parents of the working folder, see `resolve_program`), a notebook that declares
            a worker (its plain nbconvert export runs, see `dynamo_nb.launch.programs`),
            either as ``FILE:NAME`` to name the worker its entry point runs, ``"-m"`` followed
            by a module in ``args``, or an executable.
        args: its flags; numbers and paths are turned into strings.
        name: a short name for logs (default: the script's stem).
        ready: a regular expression; ready once a line matches it (default ``^READY``).
            None: do not wait for a line.
        instance: ``ns.comp.ep`` (or ``dyn://…``): ready once a new instance of it appears
            in ``runtime``'s discovery. Both conditions must hold when both are given.
        runtime: the runtime whose discovery ``instance`` is looked up in.
        timeout: seconds to wait for readiness; then the process is stopped and
            `LaunchError` (with the last log lines) is raised.
        env: variables added to this process's environment.
        cwd: the working folder of the program (default: this one).
        log_dir: where the log file goes (default: a ``dynamo_nb-logs`` temp folder).
        show_logs: show output live (a widget in a notebook, prefixed lines on stdout in a script).
        host: run it inside this `dynamo_nb.testing.hosts.Host` (a network namespace; needs root).

    Raises:
        LaunchError: it exited or was not ready in time (it has been stopped then).
        ConfigError: the program was not found, or ``instance`` came without ``runtime``.

    Example::

        fe = await launch("components/frontend.py", "--discovery", etcd_url, "--http-port", 0)
        fe.url
        # 'http://127.0.0.1:41234'
    """
    if instance is not None and runtime is None:
        raise ConfigError("instance= needs runtime= (the runtime whose discovery to watch)")
    if instance is not None and runtime is not None and runtime.is_static:
        raise ConfigError("instance= needs a runtime with discovery (memory or etcd), not a static one")
    file, declared = split_reference(os.fspath(program))
    if file.endswith(".ipynb") or declared is not None:  # a notebook runs as its export, made off the loop
        program = await asyncio.to_thread(_checked_program, os.fspath(program), cwd)
    await settle_leftovers_once()
    managed = _start(program, args, name=name, env=env, cwd=cwd, log_dir=log_dir, host=host)
    managed._watch_exit(asyncio.get_running_loop())
    managed._ready_pattern = re.compile(ready) if ready is not None else None
    title = f"{managed.name} · pid {managed.pid}" + (f" · host {host.name}" if host is not None else "")
    managed._sink = log_sink(show_logs, in_notebook(), managed.name, title, str(managed.log_path))
    if managed._sink is not None:
        managed._sink.status("starting")
    managed._start_pump(asyncio.get_running_loop())
    try:
        await managed._wait_ready(instance, runtime, timeout)
    except BaseException:
        if managed.running:  # cancelled (e.g. a notebook interrupt): leave nothing behind
            await managed.stop(timeout=2.0)
        raise
    return managed


class _ForeignProcess:
    """A process this one did not start (an adopted leftover), shaped like the parts of
    `subprocess.Popen` a `ManagedProcess` uses. Its exit status is unknown: -1 once it is gone."""

    stdout = None

    def __init__(self, leftover: Leftover) -> None:
        self.pid = leftover.pid
        self.start = leftover.start
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and process_start(self.pid) != self.start:
            self.returncode = -1
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return code


def adopt_leftovers() -> list[ManagedProcess]:
    """Take over the process groups that dead processes (a killed kernel) left running, instead of
    letting this process's first `launch` stop them: they join `launched`, can be stopped and
    waited for, and this process's reaper stops them if this process dies. Their output went to
    the dead owner; `ManagedProcess.logs` shows the end of their log file.

    Example::

        [p.name for p in adopt_leftovers()]  # in a new kernel, before anything is launched
        # ['hf_worker', 'frontend']
    """
    mark_settled()
    adopted = []
    found = leftovers(wait_for_reapers=GRACE_S + 1.0)  # a dead owner's reaper may still be at work
    for leftover in found:
        process = _ForeignProcess(leftover)
        log_path = Path(leftover.log_path)
        managed = ManagedProcess(leftover.name, leftover.command, process, log_path)  # type: ignore[arg-type]  # _ForeignProcess has the Popen methods ManagedProcess calls
        with contextlib.suppress(OSError):
            managed._lines.extend(log_path.read_text(errors="replace").splitlines()[-200:])
        managed.ready_after = 0.0
        _LAUNCHED[leftover.pid] = managed
        ledger().record(leftover.pid, leftover.name, leftover.command, leftover.log_path, leftover.start)
        adopted.append(managed)
    release(found)
    if adopted:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in adopted)
        print(f"dynamo_nb: adopted {len(adopted)} process group(s) left running: {names}", file=sys.stderr)
    return adopted


def launched() -> list[ManagedProcess]:
    """What `launch` started and still runs, oldest first.

    Example::

        launched()
        # [<ManagedProcess hf_worker pid=4242 ready>, <ManagedProcess frontend pid=4250 ready>]
    """
    return [p for p in _LAUNCHED.values() if p.running]


@atexit.register
def stop_all_now(timeout: float = 5.0) -> None:
    """SIGTERM every launched group at once, give them ``timeout`` s together, then SIGKILL
    (blocking; run at interpreter exit)."""
    processes = list(_LAUNCHED.values())
    _LAUNCHED.clear()
    for process in processes:
        if process.running:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(p.running for p in processes) and time.monotonic() < deadline:
        time.sleep(0.02)
    for process in processes:
        process._stop_now(0)
