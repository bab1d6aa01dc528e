"""The prefill and decode roles that every engine shares: rooms, the bootstrap handoff, checks.

An engine that serves disaggregated requests mixes in `BootstrapRole` (its bootstrap server
and KV timeout) and builds its two handlers on these helpers:

- `prefill_stream`: the prefill role's stream — ``disaggregated_params`` (host, port, room)
  first, then the engine's prefill; its KV header and payload are parked under the room (or
  the room fails, so the decode learns why at once); then the first token as the final item.
- `fetch_prompt_kv`: the decode role's fetch — where the KV is (``bootstrap_info`` or
  ``prefill_result.disaggregated_params``), the KV itself, checked against the prompt.

Example:
    >>> async def run():                                    # the engine's own prefill     # doctest: +SKIP
    ...     return {"first_token": 7, "prompt_tokens": 3, "payload_bytes": 0}, b""
    >>> async for item in prefill_stream(engine.bootstrap, parsed, run): ...              # doctest: +SKIP
    >>> header, payload = await fetch_prompt_kv(parsed, timeout=30)                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._context import Context
from ..errors import ConfigError, DisaggregationError
from ..llm.protocol import PreprocessedRequest, final_item
from .bootstrap import BootstrapServer, fetch_kv
from .rooms import MAX_ROOM, BootstrapInfo, draw_room

__all__ = ["BootstrapRole", "bootstrap_of", "fetch_prompt_kv", "prefill_stream", "requested_room"]


class BootstrapRole:
    """Mixin of an engine with prefill and decode roles: it gives the engine `prefill`, the
    prefill role's handler, from the engine's ``_parse(request)`` and
    ``_prefill_handoff(parsed, context)`` (prefill the prompt; the KV header, with
    ``first_token``, and payload to park).

    Attributes:
        bootstrap: the prefill role's `BootstrapServer` (`start_bootstrap`), else None.
        kv_timeout: how long the decode role waits for its prefill's KV, in seconds.
    """

    bootstrap: BootstrapServer | None = None
    kv_timeout: float = 30.0

    def _parse(self, request: dict[str, Any]) -> PreprocessedRequest:
        return PreprocessedRequest.from_dict(request)

    async def _prefill_handoff(
        self, parsed: PreprocessedRequest, context: Context | None
    ) -> tuple[dict[str, Any], bytes]:
        raise NotImplementedError

    async def prefill(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The prefill role: ``{"token_ids": [], "disaggregated_params": {bootstrap_host,
        bootstrap_port, bootstrap_room}}`` first (the room is ``bootstrap_info.bootstrap_room``
        when the router drew one, else a new one), then the first token as the final item. A
        prefill that fails or is cancelled fails its room, so its decode gets the reason at
        once. Needs `start_bootstrap` first."""
        parsed = self._parse(request)
        stream = prefill_stream(self.bootstrap, parsed, lambda: self._prefill_handoff(parsed, context))
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                yield item

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0
    ) -> BootstrapServer:
        """Start (once) the bootstrap server the prefill role parks KV caches in."""
        if self.bootstrap is None:
            self.bootstrap = await BootstrapServer.start(host, port, ttl=ttl)
        return self.bootstrap

    async def stop_bootstrap(self) -> None:
        if self.bootstrap is not None:
            await self.bootstrap.stop()


def requested_room(bootstrap_info: dict[str, Any] | None) -> int:
    """The router's room from ``bootstrap_info``, or a fresh one.

    Example:
        >>> requested_room({"bootstrap_room": 42})
        42
    """
    room = (bootstrap_info or {}).get("bootstrap_room")
    if room is None:
        return draw_room()
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
        raise DisaggregationError(
            f"bootstrap_info.bootstrap_room must be an integer in 0..2**63-1, got {room!r}"
        )
    return room


def bootstrap_of(parsed: PreprocessedRequest) -> BootstrapInfo:
    """Where a decode request's KV is: ``bootstrap_info``, else ``prefill_result.disaggregated_params``."""
    if parsed.bootstrap_info is not None:
        return BootstrapInfo.parse(parsed.bootstrap_info, "bootstrap_info")
    if parsed.prefill_result is not None:
        params = (
            parsed.prefill_result.get("disaggregated_params")
            if isinstance(parsed.prefill_result, dict)
            else None
        )
        return BootstrapInfo.parse(params, "prefill_result.disaggregated_params")
    raise DisaggregationError(
        "a decode request needs bootstrap_info (fast path) or prefill_result.disaggregated_params "
        "(fallback path); neither was sent"
    )


async def prefill_stream(
    bootstrap: BootstrapServer | None,
    parsed: PreprocessedRequest,
    run: Callable[[], Awaitable[tuple[dict[str, Any], bytes]]],
) -> AsyncIterator[dict[str, Any]]:
    """The prefill role's items (see the module docstring); ``run()`` prefills and returns the KV
    header (with ``first_token``) and payload to park."""
    if bootstrap is None:
        raise ConfigError("the prefill role needs a bootstrap server: await engine.start_bootstrap() first")
    room = requested_room(parsed.bootstrap_info)
    yield {"token_ids": [], "disaggregated_params": {**bootstrap.endpoint, "bootstrap_room": room}}
    try:
        header, payload = await run()
        bootstrap.park(room, header, payload)
    except BaseException as exc:
        bootstrap.fail(room, f"{type(exc).__name__}: {exc}")
        raise
    yield final_item([header["first_token"]], "length", len(parsed.token_ids), 1)


async def fetch_prompt_kv(parsed: PreprocessedRequest, timeout: float) -> tuple[dict[str, Any], bytes]:
    """The decode role's KV header and payload, from the prefill's bootstrap server; refuses the
    KV of another prompt."""
    info = bootstrap_of(parsed)
    header, payload = await fetch_kv(info, timeout=timeout)
    if header.get("prompt_tokens") != len(parsed.token_ids):
        raise DisaggregationError(
            f"room {info.room} holds the KV of {header.get('prompt_tokens')} prompt tokens, "
            f"but this request has {len(parsed.token_ids)}: prefill and decode got different prompts"
        )
    return header, payload
