"""What joins a prefill to its decode, typed: `BootstrapInfo` (the prefill's bootstrap server,
the room, the room's token) and `PrefillResult` (what a prefill handed back on the fallback
path: our bootstrap info, or an engine's own KV connector parameters, vLLM's
``kv_transfer_params``).

They travel inside a `dynamo_nb.llm.PreprocessedRequest` (``bootstrap_info``, ``prefill_result``)
and are parsed and checked once, where a request enters a process
(`PreprocessedRequest.from_dict`) or a prefill's answer reaches its router; everything after
reads typed fields. A malformed one is a `DisaggregationError` naming what is wrong.

Example:
    >>> info = BootstrapInfo.parse({"bootstrap_host": "127.0.0.1", "bootstrap_port": 7000, "bootstrap_room": 5})
    >>> info
    BootstrapInfo(host='127.0.0.1', port=7000, room=5, token=None)
    >>> PrefillResult.parse({"disaggregated_params": info.to_dict()}).bootstrap == info
    True
    >>> PrefillResult.from_params({"kv_transfer_params": {"remote_block_ids": [3]}}).kv_transfer_params
    {'remote_block_ids': [3]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import DisaggregationError

__all__ = ["MAX_ROOM", "MAX_TOKEN_CHARS", "BootstrapInfo", "PrefillResult", "check_token"]

MAX_ROOM = 2**63 - 1
MAX_TOKEN_CHARS = 128
_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def check_token(token: Any, what: str = "bootstrap_info") -> str:
    """``token`` if it can be a room's token (a string of 1..128 characters), else `DisaggregationError`."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
        raise DisaggregationError(
            f"{what}.bootstrap_token must be a string of 1..{MAX_TOKEN_CHARS} characters"
        )
    return token


@dataclass(frozen=True)
class BootstrapInfo:
    """Where a decode fetches its KV cache: the prefill's bootstrap server, the room, and the
    room's token (None only for engines whose own bootstrap has no tokens, as SGLang's)."""

    host: str
    port: int
    room: int
    token: str | None = None

    @classmethod
    def parse(cls, data: Any, what: str = "disaggregated_params") -> BootstrapInfo:
        """Check ``{bootstrap_host, bootstrap_port, bootstrap_room}`` (and ``bootstrap_token``);
        `DisaggregationError` names what is wrong (``what`` says where it came from)."""
        if not isinstance(data, dict):
            raise DisaggregationError(f"{what} must be an object with {', '.join(_KEYS)}, got {data!r}")
        missing = [key for key in _KEYS if data.get(key) is None]
        if missing:
            raise DisaggregationError(f"{what} lacks {', '.join(missing)} (it has {sorted(data)})")
        host, port, room = (data[key] for key in _KEYS)
        if not isinstance(host, str) or not host:
            raise DisaggregationError(f"{what}.bootstrap_host must be a host name, got {host!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise DisaggregationError(f"{what}.bootstrap_port must be a port number, got {port!r}")
        if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
            raise DisaggregationError(f"{what}.bootstrap_room must be an integer in 0..2**63-1, got {room!r}")
        token = data.get("bootstrap_token")
        return cls(host, port, room, None if token is None else check_token(token, what))

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"bootstrap_host", "bootstrap_port", "bootstrap_room"}`` and
        ``bootstrap_token`` when there is one."""
        out: dict[str, Any] = {
            "bootstrap_host": self.host,
            "bootstrap_port": self.port,
            "bootstrap_room": self.room,
        }
        if self.token is not None:
            out["bootstrap_token"] = self.token
        return out


@dataclass(frozen=True)
class PrefillResult:
    """What a prefill handed its decode on the fallback path (its ``disaggregated_params``):
    exactly one of ``bootstrap`` (our bootstrap server's room) or ``kv_transfer_params`` (an
    engine's own KV connector, vLLM's)."""

    bootstrap: BootstrapInfo | None = None
    kv_transfer_params: dict[str, Any] | None = None

    @classmethod
    def from_params(
        cls, params: Any, what: str = "the prefill worker's disaggregated_params"
    ) -> PrefillResult:
        """A prefill's ``disaggregated_params``, checked: an engine's own KV connector handoff
        (``{"kv_transfer_params": {...}}``) as it is, else bootstrap host, port and room.

        Example:
            >>> PrefillResult.from_params({"bootstrap_host": "127.0.0.1", "bootstrap_port": 7000})
            Traceback (most recent call last):
            ...
            dynamo_nb.errors.DisaggregationError: the prefill worker's disaggregated_params lacks bootstrap_room ...
        """
        if isinstance(params, dict) and isinstance(params.get("kv_transfer_params"), dict):
            return cls(kv_transfer_params=params["kv_transfer_params"])
        return cls(bootstrap=BootstrapInfo.parse(params, what))

    @classmethod
    def parse(cls, data: Any, what: str = "prefill_result") -> PrefillResult:
        """Read a request's ``prefill_result`` (``{"disaggregated_params": {...}}``)."""
        params = data.get("disaggregated_params") if isinstance(data, dict) else None
        return cls.from_params(params, f"{what}.disaggregated_params")

    @property
    def params(self) -> dict[str, Any]:
        """The ``disaggregated_params`` wire form."""
        if self.kv_transfer_params is not None:
            return {"kv_transfer_params": self.kv_transfer_params}
        assert self.bootstrap is not None
        return self.bootstrap.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The wire form of a request's ``prefill_result``."""
        return {"disaggregated_params": self.params}
