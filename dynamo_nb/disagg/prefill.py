"""The prefill side of disaggregated serving: where a prefill parks its prompt's KV.

An engine with prefill and decode roles mixes in `BootstrapRole` (its bootstrap server and KV
timeout) and builds its prefill on `prefill_stream`: ``disaggregated_params`` (host, port,
room, token) first, then the engine's prefill; its KV header and payload are parked under the
room (or the room fails, so the decode learns why at once); then the first token as the final
item. The decode side is `dynamo_nb.disagg.decode`.

An engine's prefill, in short::

    async def run():                        # the engine prefills the prompt, packs its KV
        return {"first_token": 7, "prompt_tokens": 3, "payload_bytes": 0}, b""
    async for output in prefill_stream(engine.bootstrap, request, run): ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..errors import ConfigError
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from ..runtime.streams import closing
from .bootstrap import BootstrapServer
from .rooms import draw_room, draw_token

__all__ = ["BootstrapRole", "prefill_stream"]


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
        async with closing(stream) as items:
            async for item in items:
                yield item

    @property
    def handoff_endpoint(self) -> dict[str, Any] | None:
        """The bootstrap server's ``{bootstrap_host, bootstrap_port}`` once `start_bootstrap` ran."""
        return self.bootstrap.endpoint if self.bootstrap is not None else None

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0, advertise_host: str | None = None
    ) -> BootstrapServer:
        """Start (once) the bootstrap server the prefill role parks KV caches in, listening on
        ``host:port``; decode workers are told ``advertise_host`` (default ``host``)."""
        if self.bootstrap is None:
            self.bootstrap = await BootstrapServer.start(host, port, ttl=ttl, advertise_host=advertise_host)
        return self.bootstrap

    async def stop_bootstrap(self) -> None:
        if self.bootstrap is not None:
            await self.bootstrap.stop()


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
    asked = request.bootstrap_info  # the router drew the room (fast path), else it is drawn here
    room = asked.room if asked is not None else draw_room()
    token = asked.token if asked is not None and asked.token is not None else draw_token()
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
