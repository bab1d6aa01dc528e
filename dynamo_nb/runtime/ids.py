"""Identifiers: 63-bit instance ids and short random request ids."""

from __future__ import annotations

import hashlib
import random
import secrets

__all__ = ["new_instance_id", "new_request_id", "stable_id"]


def new_instance_id() -> int:
    """A random non-zero id in 1..2**63-1 (etcd lease ids live in the same range)."""
    return secrets.randbits(63) or 1


def new_request_id() -> str:
    """A random 16-hex-digit request id: unique, not secret (clients see it), so drawn from
    Python's generator (seeded from the OS, reseeded in a forked child) without a system call
    per request.

    Example:
        >>> len(new_request_id()), new_request_id() != new_request_id()
        (16, True)
    """
    return f"{random.getrandbits(64):016x}"


def stable_id(*parts: str) -> int:
    """A deterministic non-zero 63-bit id for ``parts`` (used by static endpoints)."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") & (2**63 - 1)) or 1
