"""Frontend processes that share one KV-router policy: a change made through one reaches the others.

``--http-workers N`` runs N frontend processes on one port, and an admin ``PATCH
/router_policy`` reaches the one the kernel handed its connection to; a fleet has several
frontends, and Dynamo's Live Retune patches each. `PolicySync` sends each policy change made in
this process to the others of its group over the event plane (topic ``router_policy_<group>``
of the ``dynamo_nb.frontend`` component) and applies theirs. The group is
``--router-policy-group NAME`` (frontends of your own; those without the admin API follow the
ones with it), or, for ``--http-workers N`` with the admin API, one the first process makes and
hands to the others in `GROUP_ENV`.

Each change carries a version, ``(milliseconds, sender)``: a process takes a policy only with a
higher version than the one it runs, so two changes made at once on two processes end the same
everywhere (the later one). The event plane delivers at most once, so after its first change
each process repeats its version and policy every ``heartbeat`` seconds, and one that missed a
change, or started after it, catches up.

Example::

    sync = await PolicySync.start(runtime, "3f2a9c", apply=frontend_apply)
    sync.changed_here(new_policy)      # after a local change: the others take it
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..router.policy import RouterPolicy

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["GROUP_ENV", "PolicySync"]

logger = logging.getLogger("dynamo_nb.frontend")

GROUP_ENV = "DYN_NB_ROUTER_POLICY_GROUP"
"""``--router-policy-group``'s variable: how ``--http-workers`` hands its replicas the first process's group."""

TOPIC_PREFIX = "router_policy_"
Version = tuple[int, int]


class PolicySync:
    """Shares this process's router policy changes with its group (see the module docstring).

    Attributes:
        group: the group's name (a random hex string by default).
        sender: this process's id in the messages (random, 63 bits).
        version: the version of the policy running here, ``(0, 0)`` before any change.
        received: changes of other processes applied here.
    """

    def __init__(
        self, group: str, apply: Callable[[RouterPolicy, str], None], *, heartbeat: float = 2.0
    ) -> None:
        if not group or not all(c.isalnum() or c in "-_" for c in group):
            raise ConfigError(
                f"a frontend group is letters, digits, - and _ (it names an event topic), got {group!r}"
            )
        self.group = group
        self.sender = secrets.randbits(63)
        self.version: Version = (0, 0)
        self.received = 0
        self._apply = apply
        self._heartbeat = heartbeat
        self._policy: RouterPolicy | None = None
        self._component: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._repeater: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @classmethod
    async def start(
        cls,
        runtime: DistributedRuntime,
        group: str,
        *,
        apply: Callable[[RouterPolicy, str], None],
        heartbeat: float = 2.0,
    ) -> PolicySync:
        """Listen to the group's changes; ``apply(policy, source)`` sets a policy another process
        changed (``source`` names it, for the log)."""
        sync = cls(group, apply, heartbeat=heartbeat)
        sync._component = runtime.namespace("dynamo_nb").component("frontend")
        sync._unsubscribe = await sync._component.subscribe_events(sync.topic, sync._on_message)
        sync._repeater = asyncio.get_running_loop().create_task(sync._repeat(), name="dynamo_nb.policy_sync")
        return sync

    @property
    def topic(self) -> str:
        """The event topic of this group."""
        return TOPIC_PREFIX + self.group

    def changed_here(self, policy: RouterPolicy) -> None:
        """Share ``policy``, just set in this process, with a version above any seen so far."""
        self.version = (max(int(time.time() * 1000), self.version[0] + 1), self.sender)
        self._policy = policy
        self._wake.set()  # sent now, then every heartbeat

    def _on_message(self, message: dict[str, Any]) -> None:
        try:
            version: Version = (int(message["version"][0]), int(message["version"][1]))
            policy = RouterPolicy(**message["policy"])
        except (KeyError, TypeError, ValueError, IndexError, ConfigError) as exc:
            logger.warning("router policy sync: a malformed message ignored (%s)", exc)
            return
        if version[1] == self.sender or version <= self.version:
            return  # our own, or not newer than what runs here
        self.version, self._policy = version, policy
        self.received += 1
        self._apply(policy, f"frontend process {version[1]:x} of group {self.group}")

    async def _repeat(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._heartbeat)
            self._wake.clear()
            if self._policy is None:
                continue
            message = {"version": list(self.version), "policy": self._policy.to_dict()}
            try:
                await self._component.publish_event(self.topic, message)
            except Exception as exc:  # the event plane is down: the next heartbeat tries again
                logger.warning("router policy sync: could not publish (%s); retrying", exc)

    async def stop(self) -> None:
        """Stop listening and repeating."""
        if self._repeater is not None:
            self._repeater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._repeater
            self._repeater = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __repr__(self) -> str:
        return f"<PolicySync group={self.group} version={self.version} received={self.received}>"
