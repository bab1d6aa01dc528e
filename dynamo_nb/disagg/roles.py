"""The prefill and decode roles that every disaggregated engine shares.

An engine that serves disaggregated requests mixes in `BootstrapRole` (its bootstrap server
and KV timeout) and builds its two roles on these helpers:

- `prefill_stream`: the prefill role's stream — ``disaggregated_params`` (host, port, room)
  first, then the engine's prefill; its KV header and payload are parked under the room (or
  the room fails, so the decode learns why at once); then the first token as the final item.
- `fetch_prompt_kv`: the decode role's fetch — where the KV is (``bootstrap_info`` or
  ``prefill_result.disaggregated_params``), the KV itself, checked against the prompt.

An engine with both roles is a `DisaggregatedEngine`; what a worker's ``--mode`` makes of it
is `dynamo_nb.disagg.modes.WorkerRole`.

Example:
    >>> requested_room({"bootstrap_room": 42})
    42

An engine's prefill, in short::

    async def run():                        # the engine prefills the prompt, packs its KV
        return {"first_token": 7, "prompt_tokens": 3, "payload_bytes": 0}, b""
    async for output in prefill_stream(engine.bootstrap, request, run): ...
    header, payload = await fetch_prompt_kv(request, timeout=30)   # on the decode side
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, DisaggregationError
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from .bootstrap import BootstrapServer, fetch_kv
from .rooms import MAX_ROOM, BootstrapInfo, check_token, draw_room, draw_token

__all__ = [
    "BootstrapRole",
    "DisaggregatedEngine",
    "bootstrap_of",
    "fetch_prompt_kv",
    "prefill_stream",
    "requested_room",
    "requested_token",
]


@runtime_checkable
class DisaggregatedEngine(Protocol):
    """An engine (`dynamo_nb.engines.Engine`) with the prefill and decode roles of disaggregated serving.

    ``prefill`` yields ``disaggregated_params`` (bootstrap host, port, room) first and parks the
    prompt's KV for its decode; ``decode`` fetches it and goes on from the prefill's first token.
    ``start_bootstrap`` starts the server the prefill role parks KV caches in (a no-op for an
    engine whose KV moves by its own means, as vLLM's connector or SGLang's bootstrap server).

    Attributes:
        kv_timeout: how long the decode role waits for its prefill's KV, in seconds (given to
            the constructor, ``--kv-timeout``).
        handoff_endpoint: where decode workers fetch the KV this engine's prefills park, as
            ``{bootstrap_host, bootstrap_port}``: the prefill worker publishes it in its card as
            ``disaggregated_endpoint``, and the frontend takes the fast path (it draws the
            room). None: the fallback path (the frontend waits for the prefill's params).
            `BootstrapRole`'s is its bootstrap server's, once started.
    """

    kv_timeout: float

    @property
    def handoff_endpoint(self) -> dict[str, Any] | None: ...

    def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    async def start_bootstrap(self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0) -> Any: ...


class BootstrapRole:
    """Mixin of an engine with prefill and decode roles: it gives the engine `prefill` from the
    engine's ``check_request(request)`` (refuse what it cannot serve) and
    ``_prefill_handoff(request, context)`` (prefill the prompt; the KV header, with
    ``first_token``, and payload to park).

    Attributes:
        bootstrap: the prefill role's `BootstrapServer` (`start_bootstrap`), else None.
        kv_timeout: how long the decode role waits for its prefill's KV, in seconds.
    """

    bootstrap: BootstrapServer | None = None
    kv_timeout: float = 30.0

    def check_request(self, request: PreprocessedRequest) -> None:
        """Raise `InvalidRequestError` for a request this engine cannot serve (default: none)."""

    async def _prefill_handoff(
        self, request: PreprocessedRequest, context: Context | None
    ) -> tuple[dict[str, Any], bytes]:
        raise NotImplementedError

    async def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The prefill role: an output with no tokens and ``disaggregated_params`` {bootstrap_host,
        bootstrap_port, bootstrap_room} first (the room is ``bootstrap_info.bootstrap_room``
        when the router drew one, else a new one), then the first token as the final item. A
        prefill that fails or is cancelled fails its room, so its decode gets the reason at
        once. Needs `start_bootstrap` first."""
        self.check_request(request)
        stream = prefill_stream(
            self.bootstrap,
            request,
            lambda: self._prefill_handoff(request, context),
            stopped=(context.is_stopped if context is not None else None),
        )
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                yield item

    @property
    def handoff_endpoint(self) -> dict[str, Any] | None:
        """The bootstrap server's ``{bootstrap_host, bootstrap_port}`` once `start_bootstrap` ran."""
        return self.bootstrap.endpoint if self.bootstrap is not None else None

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
    """The router's room from ``bootstrap_info``, or a fresh one."""
    room = (bootstrap_info or {}).get("bootstrap_room")
    if room is None:
        return draw_room()
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
        raise DisaggregationError(
            f"bootstrap_info.bootstrap_room must be an integer in 0..2**63-1, got {room!r}"
        )
    return room


def requested_token(bootstrap_info: dict[str, Any] | None) -> str:
    """The router's room token from ``bootstrap_info``, or a fresh one."""
    token = (bootstrap_info or {}).get("bootstrap_token")
    return draw_token() if token is None else check_token(token)


def bootstrap_of(request: PreprocessedRequest) -> BootstrapInfo:
    """Where a decode request's KV is: ``bootstrap_info``, else ``prefill_result.disaggregated_params``."""
    if request.bootstrap_info is not None:
        return BootstrapInfo.parse(request.bootstrap_info, "bootstrap_info")
    if request.prefill_result is not None:
        result = request.prefill_result
        params = result.get("disaggregated_params") if isinstance(result, dict) else None
        return BootstrapInfo.parse(params, "prefill_result.disaggregated_params")
    raise DisaggregationError(
        "a decode request needs bootstrap_info (fast path) or prefill_result.disaggregated_params "
        "(fallback path); neither was sent"
    )


async def prefill_stream(
    bootstrap: BootstrapServer | None,
    request: PreprocessedRequest,
    run: Callable[[], Awaitable[tuple[dict[str, Any], bytes]]],
    *,
    stopped: Callable[[], bool] | None = None,
) -> AsyncIterator[LLMEngineOutput]:
    """The prefill role's items (see the module docstring); ``run()`` prefills and returns the KV
    header (with ``first_token``) and payload to park. A request stopped (``stopped()``) or
    cancelled meanwhile parks nothing: its room is dropped at once, not left to expire."""
    if bootstrap is None:
        raise ConfigError("the prefill role needs a bootstrap server: await engine.start_bootstrap() first")
    room = requested_room(request.bootstrap_info)
    token = requested_token(request.bootstrap_info)
    params = {**bootstrap.endpoint, "bootstrap_room": room, "bootstrap_token": token}
    yield LLMEngineOutput([], disaggregated_params=params)
    try:
        header, payload = await run()
    except (asyncio.CancelledError, GeneratorExit):
        bootstrap.discard(room)
        raise
    except BaseException as exc:
        bootstrap.fail(room, f"{type(exc).__name__}: {exc}", token)
        raise
    if stopped is not None and stopped():  # the client left: nobody will fetch it
        bootstrap.discard(room)
        yield LLMEngineOutput.final(
            [], "cancelled", prompt_tokens=len(request.token_ids), completion_tokens=0
        )
        return
    bootstrap.park(room, header, payload, token)
    yield LLMEngineOutput.final(
        [header["first_token"]], "length", prompt_tokens=len(request.token_ids), completion_tokens=1
    )


async def fetch_prompt_kv(request: PreprocessedRequest, timeout: float) -> tuple[dict[str, Any], bytes]:
    """The decode role's KV header and payload, from the prefill's bootstrap server; refuses the
    KV of another prompt."""
    info = bootstrap_of(request)
    header, payload = await fetch_kv(info, timeout=timeout)
    if header.get("prompt_tokens") != len(request.token_ids):
        raise DisaggregationError(
            f"room {info.room} holds the KV of {header.get('prompt_tokens')} prompt tokens, "
            f"but this request has {len(request.token_ids)}: prefill and decode got different prompts"
        )
    return header, payload
