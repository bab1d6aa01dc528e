"""File discovery: processes on one host find each other through a folder, without etcd.

Dynamo's file-backed discovery store (``--discovery-backend file``) for dynamo_nb:
``--discovery file://DIR`` (or ``DistributedRuntime.create("file:///tmp/dyn")``). Layout::

    DIR/leases/<lease>           one per runtime ("<pid> <ttl>"); its mtime is refreshed every TTL/3
    DIR/keys/<key>@<lease>       one per key (an instance, a model card), its value as bytes

A key lives while its lease file is fresher than its runtime's TTL (written in the lease file):
a runtime that shuts down deletes its files, one that dies stops refreshing and every reader
drops its keys after that runtime's ``lease_ttl`` seconds (and removes the stale files after
twice that). A folder wiped under running processes (each notices its own lease file gone) is
written again by every runtime at once, and the keys it lost stay listed meanwhile. Writes are atomic (a temporary file
renamed into place). Readers poll the folder (every ``poll_interval`` seconds, in a thread) and
apply the differences to their watches, so a new worker is seen within a poll.

Example::

    runtime = await DistributedRuntime.create(discovery="file:///tmp/dynamo-nb")   # TCP plane
    python components/hf_worker.py --discovery file:///tmp/dynamo-nb
    python components/frontend.py --discovery file:///tmp/dynamo-nb
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, unquote

from ...errors import ConfigError
from ..ids import new_instance_id
from .base import KeyValueDiscovery, PrefixWatch, cancel_tasks

__all__ = ["DYNAMO_LAYOUT", "FileDiscovery", "dynamo_folder_error", "parse_file_url"]

logger = logging.getLogger("dynamo_nb.discovery.file")

POLL_INTERVAL = 0.25

DYNAMO_LAYOUT = "v1"
"""The top folder NVIDIA Dynamo's own file discovery (``DYN_FILE_KV``) keeps its keys under: a
folder holding it belongs to workers on Dynamo's runtime, which the kit's readers cannot list."""


def dynamo_folder_error(root: Path) -> ConfigError:
    """What to do when the kit is pointed at a folder of Dynamo's runtime."""
    return ConfigError(
        f"{root} is NVIDIA Dynamo's discovery folder (it holds {DYNAMO_LAYOUT}/: workers started with "
        f"--runtime dynamo), which the kit's runtime cannot read: serve them with Dynamo's frontend "
        f"(python -m dynamo_nb dynamo-frontend --discovery file://{root}), or give the kit's programs a "
        "folder of their own"
    )


def parse_file_url(url: str) -> Path:
    """``file://DIR`` → the folder (absolute; a relative one is taken from the working folder).

    Example:
        >>> parse_file_url("file:///tmp/dynamo-nb")
        PosixPath('/tmp/dynamo-nb')
    """
    if not url.startswith("file://") or not url[len("file://") :]:
        raise ConfigError(
            f"invalid file discovery URL {url!r}: expected 'file://DIR', e.g. file:///tmp/dynamo-nb"
        )
    return Path(url[len("file://") :]).expanduser().resolve()


def _file_name(key: str, lease: int) -> str:
    return f"{quote(key, safe='')}@{lease:x}"


def _parse_file_name(name: str) -> tuple[str, int] | None:
    quoted, sep, lease = name.rpartition("@")
    if not sep:
        return None
    try:
        return unquote(quoted), int(lease, 16)
    except ValueError:
        return None


class FileDiscovery(KeyValueDiscovery):
    """Discovery through a folder shared by the processes of one host (see the module docstring)."""

    kind = "file"

    def __init__(self, url: str, *, lease_ttl: float = 10.0, poll_interval: float = POLL_INTERVAL) -> None:
        super().__init__()
        self.url = url
        self.root = parse_file_url(url)
        if lease_ttl <= 3 * poll_interval:
            raise ConfigError(f"lease_ttl must be more than {3 * poll_interval:g} s, got {lease_ttl}")
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self._leases = self.root / "leases"
        self._keys = self.root / "keys"
        self._owned: dict[str, bytes] = {}
        self._watches: list[PrefixWatch] = []
        self._cache: dict[str, tuple[int, bytes]] = {}  # file name → (mtime_ns, value)
        self._scanning = threading.Lock()  # scans run in threads
        self._wipe_noticed = False  # a wipe recovered from, not yet told to the watches (the poll does)
        self._ttls: dict[str, float] = {}  # lease file → the TTL its runtime wrote in it
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._dynamo_noticed = False  # Dynamo's runtime writing here too: said once

    def describe(self) -> str:
        return self.url

    async def start(self) -> None:
        if (self.root / DYNAMO_LAYOUT).is_dir():  # before writing anything there
            raise dynamo_folder_error(self.root)
        try:
            self._make_folders()
        except OSError as exc:
            raise ConfigError(
                f"file discovery cannot use {self.root} ({exc}); pass a folder you can write"
            ) from None
        self.connection_id = new_instance_id()
        self._touch_lease()
        loop = asyncio.get_running_loop()
        self._tasks += [
            loop.create_task(self._keep_alive(), name="dynamo_nb file lease"),
            loop.create_task(self._poll(), name="dynamo_nb file watch"),
        ]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_tasks(self._tasks)
        await asyncio.to_thread(self._remove_own_files)

    def _remove_own_files(self) -> None:
        """Our keys and lease, removed once no scan of ours is writing them back (the lock)."""
        with self._scanning:
            for key in list(self._owned):
                self._unlink(self._keys / _file_name(key, self.connection_id))
            self._owned.clear()
            self._unlink(self._leases / f"{self.connection_id:x}")

    async def put(self, key: str, value: bytes) -> None:
        self._owned[key] = value
        self._write(key, value)
        for watch in self._watches:  # this runtime sees its own keys at once
            if key.startswith(watch.prefix):
                watch.apply(key, value)

    async def delete(self, key: str) -> None:
        self._owned.pop(key, None)
        self._unlink(self._keys / _file_name(key, self.connection_id))
        for watch in self._watches:
            if key.startswith(watch.prefix):
                watch.apply(key, None)

    async def watch_prefix(self, prefix: str) -> PrefixWatch:
        watch = PrefixWatch(prefix)
        snapshot = await asyncio.to_thread(self._scan)
        watch.replace_all({k: v for k, v in snapshot.items() if k.startswith(prefix)})
        self._watches.append(watch)
        return watch

    # -- files

    def _make_folders(self) -> None:
        for folder in (self._leases, self._keys, self.root / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)

    def _recover_unlocked(self) -> bool:
        """Whether the folder was wiped since we last looked (this runtime's own lease file is
        gone, which only its close removes); if so, make the folders again and write our lease
        and keys back at once. Runs in a thread, holding ``_scanning`` (so a close that removes
        our files never races it)."""
        if self._closed or (self._leases / f"{self.connection_id:x}").exists():
            return False
        logger.warning("file discovery: %s was wiped; writing this process's lease and keys again", self.root)
        self._wipe_noticed = True
        self._make_folders()
        self._touch_lease()
        for key, value in self._owned.copy().items():  # a copy: put and delete run on the loop
            self._write(key, value)
        return True

    def _refresh_lease(self) -> None:
        """The keep-alive's step, in a thread: recover from a wipe, or refresh our lease and put
        back any key of ours a reader removed (it judged us stalled)."""
        with self._scanning:
            if self._recover_unlocked() or self._closed:
                return
            self._touch_lease()
            for key, value in self._owned.copy().items():
                if not (self._keys / _file_name(key, self.connection_id)).exists():
                    logger.warning(
                        "file discovery: %s was removed (this process stalled?); writing it again", key
                    )
                    self._write(key, value)

    def _write(self, key: str, value: bytes) -> None:
        self._replace(self._keys / _file_name(key, self.connection_id), value)

    def _replace(self, path: Path, content: bytes) -> None:
        """Write ``path`` atomically: a reader sees the old file or the whole new one."""
        temporary = self.root / "tmp" / uuid.uuid4().hex
        temporary.write_bytes(content)
        os.replace(temporary, path)

    def _touch_lease(self) -> None:
        lease = self._leases / f"{self.connection_id:x}"
        try:
            os.utime(lease)
        except FileNotFoundError:  # "<pid> <ttl>": readers judge this lease by its own TTL
            self._replace(lease, f"{os.getpid()} {self.lease_ttl}".encode())

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def _scan(self) -> dict[str, bytes]:
        """Every live key and its value; removes files whose lease is long gone."""
        with self._scanning:
            return self._scan_unlocked()

    def _scan_noting_wipes(self) -> tuple[dict[str, bytes], bool]:
        """`_scan`, and whether the folder was wiped since the last one (the snapshot may then
        lack keys whose owners have not written them again yet). A wipe the keep-alive noticed
        first counts too: it wrote our lease back, so the folder alone no longer shows it."""
        with self._scanning:
            self._recover_unlocked()
            snapshot = self._scan_unlocked()
            self._recover_unlocked()
            wiped, self._wipe_noticed = self._wipe_noticed, False
            return snapshot, wiped

    def _scan_unlocked(self) -> dict[str, bytes]:
        now = time.time()
        ages: dict[int, float] = {}  # lease → its age in TTLs (over 1: expired)
        for lease_file in os.scandir(self._leases):
            with contextlib.suppress(ValueError, IndexError, FileNotFoundError):
                ttl = self._ttls.get(lease_file.name) or float(Path(lease_file.path).read_text().split()[1])
                self._ttls[lease_file.name] = ttl
                ages[int(lease_file.name, 16)] = (now - lease_file.stat().st_mtime) / ttl
        live: dict[str, tuple[float, bytes]] = {}
        seen: set[str] = set()
        for entry in os.scandir(self._keys):
            parsed = _parse_file_name(entry.name)
            if parsed is None:
                continue
            key, lease = parsed
            age = ages.get(lease)
            if age is None or age > 1:
                if age is None or age > 2:  # a dead runtime's leftovers
                    self._unlink(Path(entry.path))
                continue
            try:
                stat = entry.stat()
                cached = self._cache.get(entry.name)
                if cached is None or cached[0] != stat.st_mtime_ns:
                    cached = (stat.st_mtime_ns, Path(entry.path).read_bytes())
                    self._cache[entry.name] = cached
            except FileNotFoundError:  # deleted while we looked
                continue
            seen.add(entry.name)
            if key not in live or live[key][0] < stat.st_mtime:
                live[key] = (stat.st_mtime, cached[1])
        for name in [n for n in self._cache if n not in seen]:
            del self._cache[name]
        for lease, age in ages.items():
            if age > 2:
                self._unlink(self._leases / f"{lease:x}")
                self._ttls.pop(f"{lease:x}", None)
        return {key: value for key, (_, value) in live.items()}

    # -- tasks

    async def _keep_alive(self) -> None:
        """Refresh the lease every third of the TTL; put back our keys if a reader removed them."""
        interval = self.lease_ttl / 3
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self._refresh_lease)
            except OSError as exc:
                logger.warning("file discovery lease refresh failed (%s); retrying", exc)

    async def _poll(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.poll_interval)
            if not self._watches:
                continue
            if not self._dynamo_noticed and (self.root / DYNAMO_LAYOUT).is_dir():
                self._dynamo_noticed = True
                logger.warning("file discovery: %s", dynamo_folder_error(self.root))
            try:
                snapshot, wiped = await asyncio.to_thread(self._scan_noting_wipes)
            except OSError as exc:
                logger.warning("file discovery could not read %s (%s); retrying", self.root, exc)
                continue
            for watch in list(self._watches):
                matching = {k: v for k, v in snapshot.items() if k.startswith(watch.prefix)}
                watch.replace_all(matching, reset=wiped, retain_seconds=self.retain_seconds)
