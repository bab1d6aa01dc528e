"""Instances suspected of hanging: alive to discovery (their lease holds, their connection is
open) but sending nothing. A client that shares a `SuspectInstances` routes around them while
another instance serves the endpoint, until one is cleared (a canary answered, or it sent an
item again). A process hangs as a whole, so one registry serves every client of a frontend:
an instance id names the worker process on all its endpoints.

Example:
    >>> suspects = SuspectInstances()
    >>> suspects.mark(0x1F, "sent nothing for 1.2 s (expected within 1.0 s)")
    True
    >>> 0x1F in suspects, suspects.mark(0x1F, "again")   # marked once
    (True, False)
    >>> suspects.clear(0x1F).reason
    'sent nothing for 1.2 s (expected within 1.0 s)'
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["SuspectInstances", "Suspicion"]


@dataclass(frozen=True)
class Suspicion:
    """Why an instance is suspect and since when (``time.monotonic()``)."""

    reason: str
    since: float = field(default_factory=time.monotonic)

    @property
    def for_s(self) -> float:
        """Seconds it has been suspect."""
        return time.monotonic() - self.since


class SuspectInstances:
    """Instance ids suspected of hanging, with why (see the module docstring)."""

    def __init__(self) -> None:
        self._suspects: dict[int, Suspicion] = {}

    def mark(self, instance_id: int, reason: str) -> bool:
        """Suspect ``instance_id``; False when it already was (the first reason is kept)."""
        if instance_id in self._suspects:
            return False
        self._suspects[instance_id] = Suspicion(reason)
        return True

    def clear(self, instance_id: int) -> Suspicion | None:
        """It is no longer suspect: what it was suspected of, or None when it was not."""
        return self._suspects.pop(instance_id, None)

    def get(self, instance_id: int) -> Suspicion | None:
        """Why ``instance_id`` is suspect (None: it is not)."""
        return self._suspects.get(instance_id)

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._suspects

    def __len__(self) -> int:
        return len(self._suspects)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._suspects))

    def items(self) -> list[tuple[int, Suspicion]]:
        """(instance id, suspicion) pairs."""
        return list(self._suspects.items())

    def __repr__(self) -> str:
        return f"<SuspectInstances {[f'{i:x}' for i in self._suspects]}>"
