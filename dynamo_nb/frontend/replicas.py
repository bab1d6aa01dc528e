"""Frontend processes that share one HTTP port, so the frontend uses more than one core.

The first frontend listens with ``SO_REUSEPORT`` and starts the others with the same flags
(``--http-workers N``): the kernel spreads new connections between the N listeners. Each
process has its own runtime, discovery watch, model routers and KV event subscription, so all
of them see the same workers, cards and cache contents; with ``--nats-url`` their KV routers
also share their decisions (load, routed prefixes: `dynamo_nb.router.kv.replica_sync`), so the
N processes route as one would; with the admin API they share its policy changes too
(`dynamo_nb.frontend.policy_sync`: the replicas join this process's group).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..launch import ManagedProcess, launch
from .policy_sync import GROUP_ENV

if TYPE_CHECKING:
    from .app import Frontend

__all__ = ["start_frontend_replicas", "start_http_replicas", "stop_http_replicas"]


async def start_frontend_replicas(
    frontend: Frontend, program: str, argv: Sequence[str]
) -> list[ManagedProcess]:
    """``--http-workers N``: N - 1 more processes running ``program`` with ``argv`` (the command
    that started ``frontend``) on its port, in its policy group when it has the admin API (a
    change reaching one reaches all); none when N is 1.

    Example::

        replicas = await start_frontend_replicas(frontend, __file__, sys.argv[1:])
    """
    sync = frontend.models.policy_sync
    group = {GROUP_ENV: sync.group} if sync is not None else None
    return await start_http_replicas(
        program, argv, frontend.port, frontend.config.http_workers - 1, env=group
    )


async def start_http_replicas(
    program: str,
    argv: Sequence[str],
    port: int,
    count: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> list[ManagedProcess]:
    """Start ``count`` more frontends running ``program`` with ``argv`` (and ``env`` added to
    this process's environment) on ``port`` (already bound with ``SO_REUSEPORT`` by this
    process); each is ready when it listens.

    Example::

        replicas = await start_http_replicas(__file__, sys.argv[1:], frontend.port, 1)
    """
    extra = ["--http-port", str(port), "--http-workers", "1", "--http-reuse-port"]  # the last flag wins
    started = await asyncio.gather(
        *(
            launch(
                program,
                *argv,
                *extra,
                name=f"frontend-replica{i + 1}",
                env=env,
                show_logs=False,
                timeout=timeout,
            )
            for i in range(count)
        ),
        return_exceptions=True,
    )
    replicas = [item for item in started if isinstance(item, ManagedProcess)]
    failure = next((item for item in started if isinstance(item, BaseException)), None)
    if failure is not None:
        await stop_http_replicas(replicas)
        raise failure
    return replicas


async def stop_http_replicas(replicas: Sequence[ManagedProcess], timeout: float = 10.0) -> None:
    """Stop the replicas together (SIGTERM, then SIGKILL after ``timeout`` s)."""
    await asyncio.gather(*(replica.stop(timeout=timeout) for replica in replicas))
